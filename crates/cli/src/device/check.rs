//! `blockalloc check`: a full, read-only consistency check. Exit code 0 only
//! when the device is consistent.

use blockalloc_store::{check, SlotReport};

use blockalloc_bench::units;

use super::args::CheckArgs;
use crate::checks::{write_json_object, JsonTarget};
use crate::error::Inconsistent;
use crate::out::outln;

/// Runs `check`.
///
/// # Errors
/// [`Inconsistent`] when problems were found, store errors when the state
/// cannot be recovered at all, I/O errors.
pub fn run(a: &CheckArgs) -> anyhow::Result<()> {
    let json = JsonTarget::parse(a.json.as_deref())?;
    let dev = super::open(&a.device, a.direct)?;
    let r = check(&dev)?;
    if let Some(target) = &json {
        let v = serde_json::json!({
            "device": a.device.display().to_string(),
            "consistent": r.is_consistent(),
            "problems": r.problems,
            "notes": r.notes,
            "used_blocks": r.space.used_blocks,
            "free_blocks": r.space.free_blocks,
            "free_extents": r.space.free_extents,
            "journal_entries_replayed": r.recovery.entries,
        });
        write_json_object(target, &v)?;
    }
    if json.as_ref() != Some(&JsonTarget::Stdout) {
        let bs = r.superblock.layout.block_size;
        outln!("checked {}", a.device.display())?;
        outln!(
            "  superblock copy {} used; checkpoint {} (slot {}); {} journal entries replayed",
            r.recovery.superblock_copy,
            r.recovery.checkpoint.seq,
            r.recovery.checkpoint.slot,
            r.recovery.entries
        )?;
        for (i, s) in r.recovery.slots.iter().enumerate() {
            if let SlotReport::Valid { seq, extents, .. } = s {
                outln!("  slot {i}: checkpoint {seq}, {extents} free extents")?;
            }
        }
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
            if r.is_consistent() {
                "consistent"
            } else {
                "INCONSISTENT"
            }
        )?;
    }
    if !r.is_consistent() {
        return Err(Inconsistent {
            count: r.problems.len(),
            first: r.problems[0].clone(),
        }
        .into());
    }
    Ok(())
}
