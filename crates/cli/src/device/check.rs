//! `blockalloc check`: a full, read-only consistency check. Exit code 0 only
//! when the device is consistent; 4 when it is not; 6 when it is, but
//! recovery discarded a damaged journal tail. It opens the device read-only
//! and takes no lock, so it runs beside a writer (and says its view may be
//! stale then), on read-only files and on read-only file systems.
//!
//! With `--json` it prints exactly one JSON object, also when the device
//! cannot be opened or recovered (`error` then holds the message and a
//! class, see [`crate::error::label`]).

use blockalloc_store::device::FileDevice;
use blockalloc_store::{check, CheckReport, JournalEnd, SlotReport};

use blockalloc_bench::units;

use super::args::CheckArgs;
use crate::checks::{write_json_object, JsonTarget};
use crate::error::{error_class, exit_code, Inconsistent, TailDiscarded};
use crate::out::outln;

/// Runs `check`.
///
/// # Errors
/// [`Inconsistent`] when problems were found, [`TailDiscarded`] when the
/// journal's damaged tail was discarded, store errors when the state cannot
/// be recovered at all, I/O errors.
pub fn run(a: &CheckArgs) -> anyhow::Result<()> {
    let json = JsonTarget::parse(a.json.as_deref())?;
    let dev = match super::open_read_only(&a.device, a.direct) {
        Ok(dev) => dev,
        Err(e) => return Err(failed(a, json.as_ref(), None, e)),
    };
    let writer = dev.writer();
    let r = match check(&dev) {
        Ok(r) => r,
        Err(e) => return Err(failed(a, json.as_ref(), Some(&dev), e.into())),
    };
    // A writer that started while the check read counts too.
    let writer = writer.or_else(|| dev.writer());
    let writer_note = super::writer_note(&a.device, writer);
    if let Some(target) = &json {
        let mut v = report_json(a, &r);
        v["in_use_by_writer"] = writer.is_some().into();
        v["writer_pid"] = writer.and_then(|h| h.pid()).into();
        if let Some(n) = &writer_note {
            v["notes"]
                .as_array_mut()
                .expect("notes is an array")
                .push(n.clone().into());
        }
        write_json_object(target, &v)?;
    }
    if json.as_ref() != Some(&JsonTarget::Stdout) {
        print_text(a, &r, writer_note.as_deref())?;
    }
    if !r.is_consistent() {
        return Err(Inconsistent {
            count: r.problems.len(),
            first: r.problems[0].clone(),
        }
        .into());
    }
    if let JournalEnd::TornTail { seq, bytes, .. } = &r.recovery.journal_end {
        return Err(TailDiscarded {
            entry: format!(
                "entry {seq}{}",
                bytes.map_or(String::new(), |b| format!(", {b} bytes"))
            ),
        }
        .into());
    }
    Ok(())
}

/// With `--json`, prints the one JSON object for a check that could not run;
/// returns the error.
fn failed(
    a: &CheckArgs,
    json: Option<&JsonTarget>,
    dev: Option<&FileDevice>,
    e: anyhow::Error,
) -> anyhow::Error {
    if let Some(target) = json {
        let writer = dev.and_then(FileDevice::writer);
        let v = serde_json::json!({
            "device": a.device.display().to_string(),
            "consistent": false,
            "error": {
                "message": format!("{e:#}"),
                "class": error_class(&e),
                "exit_code": exit_code(&e),
            },
            "in_use_by_writer": writer.is_some(),
            "writer_pid": writer.and_then(|h| h.pid()),
        });
        if let Err(w) = write_json_object(target, &v) {
            return w.context(format!("{e:#}"));
        }
    }
    e
}

fn report_json(a: &CheckArgs, r: &CheckReport) -> serde_json::Value {
    let discarded = super::discarded_entry(&r.recovery.journal_end);
    serde_json::json!({
        "device": a.device.display().to_string(),
        "consistent": r.is_consistent(),
        "problems": r.problems,
        "notes": r.notes,
        "used_blocks": r.space.used_blocks,
        "free_blocks": r.space.free_blocks,
        "free_extents": r.space.free_extents,
        "journal_entries_replayed": r.recovery.entries,
        "journal_tail_discarded": r.journal_tail_discarded(),
        "discarded_entry": discarded,
        "closed_cleanly": r.recovery.closed_cleanly,
        "format_version": r.recovery.format_version,
        "error": serde_json::Value::Null,
    })
}

fn print_text(a: &CheckArgs, r: &CheckReport, writer_note: Option<&str>) -> std::io::Result<()> {
    outln!("checked {}", a.device.display())?;
    if let Some(n) = writer_note {
        outln!("  note: {n}")?;
    }
    outln!(
        "  superblock copy {} used; checkpoint {} (slot {}); {} journal entries replayed{}",
        r.recovery.superblock_copy,
        r.recovery.checkpoint.seq,
        r.recovery.checkpoint.slot,
        r.recovery.entries,
        if r.recovery.closed_cleanly {
            "; closed cleanly"
        } else {
            ""
        }
    )?;
    for (i, s) in r.recovery.slots.iter().enumerate() {
        if let SlotReport::Valid { seq, extents, .. } = s {
            outln!("  slot {i}: checkpoint {seq}, {extents} free extents")?;
        }
    }
    let bs = r.superblock.layout.block_size;
    outln!(
        "  {} blocks used ({}), {} free ({}) in {} extents",
        r.space.used_blocks,
        units::bytes(r.space.used_blocks.saturating_mul(bs)),
        r.space.free_blocks,
        units::bytes(r.space.free_blocks.saturating_mul(bs)),
        r.space.free_extents
    )?;
    for n in &r.notes {
        outln!("  note: {n}")?;
    }
    for p in &r.problems {
        outln!("  PROBLEM: {p}")?;
    }
    outln!(
        "{}",
        if !r.is_consistent() {
            "INCONSISTENT"
        } else if r.journal_tail_discarded() {
            "consistent, but the journal's damaged last entry was discarded"
        } else {
            "consistent"
        }
    )?;
    Ok(())
}
