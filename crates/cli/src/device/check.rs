//! `blockalloc check`: a full, read-only consistency check. Exit code 0 only
//! when the device is consistent; 4 when it is not; 6 when it is, but
//! recovery discarded a damaged journal tail. It opens the device read-only
//! and takes no lock, so it runs beside a writer (and says its view may be
//! stale then), on read-only files and on read-only file systems.
//!
//! With `--json` it prints exactly one JSON object, also when the device
//! cannot be opened or recovered (`error` then holds the message and a
//! class, see [`crate::error::error_class`]).

use blockalloc_store::device::FileDevice;
use blockalloc_store::{check, CheckReport, JournalEnd, SlotReport};

use super::args::CheckArgs;
use crate::error::{error_class, exit_code, Inconsistent, TailDiscarded};

/// Runs `check`.
///
/// # Errors
/// [`Inconsistent`] when problems were found, [`TailDiscarded`] when the
/// journal's damaged tail was discarded, store errors when the state cannot
/// be recovered at all, I/O errors.
pub fn run(a: &CheckArgs) -> anyhow::Result<()> {
    let dev = match super::open_read_only(&a.device, a.direct) {
        Ok(dev) => dev,
        Err(e) => return Err(failed(a, None, e)),
    };
    let writer = dev.writer();
    let r = match check(&dev) {
        Ok(r) => r,
        Err(e) => return Err(failed(a, Some(&dev), e.into())),
    };
    // A writer that started while the check read counts too.
    let writer = writer.or_else(|| dev.writer());
    let writer_note = super::writer_note(&a.device, writer);
    if a.json {
        let mut v = report_json(a, &r);
        v["in_use_by_writer"] = writer.is_some().into();
        v["writer_pid"] = writer.and_then(|h| h.pid()).into();
        if let Some(n) = &writer_note {
            v["notes"]
                .as_array_mut()
                .expect("notes is an array")
                .push(n.clone().into());
        }
        println!("{v}");
    } else {
        print_text(a, &r, writer_note.as_deref());
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
fn failed(a: &CheckArgs, dev: Option<&FileDevice>, e: anyhow::Error) -> anyhow::Error {
    if a.json {
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
        println!("{v}");
    }
    e
}

fn report_json(a: &CheckArgs, r: &CheckReport) -> serde_json::Value {
    let discarded = match &r.recovery.journal_end {
        JournalEnd::TornTail { seq, bytes, reason } => {
            serde_json::json!({"seq": seq, "bytes": bytes, "reason": reason})
        }
        _ => serde_json::Value::Null,
    };
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
        "error": serde_json::Value::Null,
    })
}

fn print_text(a: &CheckArgs, r: &CheckReport, writer_note: Option<&str>) {
    println!("checked {}", a.device.display());
    if let Some(n) = writer_note {
        println!("  note: {n}");
    }
    println!(
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
    );
    for (i, s) in r.recovery.slots.iter().enumerate() {
        if let SlotReport::Valid { seq, extents, .. } = s {
            println!("  slot {i}: checkpoint {seq}, {extents} free extents");
        }
    }
    println!(
        "  {} blocks used, {} free in {} extents",
        r.space.used_blocks, r.space.free_blocks, r.space.free_extents
    );
    for n in &r.notes {
        println!("  note: {n}");
    }
    for p in &r.problems {
        println!("  PROBLEM: {p}");
    }
    println!(
        "{}",
        if !r.is_consistent() {
            "INCONSISTENT"
        } else if r.journal_tail_discarded() {
            "consistent, but the journal's damaged last entry was discarded"
        } else {
            "consistent"
        }
    );
}
