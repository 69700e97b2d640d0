//! `blockalloc inspect`: geometry, space, free-space histogram,
//! fragmentation, journal and checkpoint state. Opens the device read-only
//! (no lock, so it runs beside a writer and says its view may be stale then;
//! read-only files and file systems work) and writes nothing.

use blockalloc_bench::units;
use blockalloc_store::format::FORMAT_VERSION;
use blockalloc_store::{JournalEnd, SlotReport, Store};

use super::args::InspectArgs;
use crate::checks::{write_json_object, JsonTarget};
use crate::out::outln;

/// Free extents by size: bucket `i` holds lengths in `[2^i, 2^(i+1))`
/// blocks. Returns `(low, high_exclusive, count, blocks)` per non-empty
/// bucket.
pub fn histogram(lengths: impl IntoIterator<Item = u64>) -> Vec<(u64, u64, u64, u64)> {
    let mut b = [(0u64, 0u64); 64];
    for len in lengths {
        let i = 63 - len.leading_zeros() as usize;
        b[i].0 += 1;
        b[i].1 += len;
    }
    b.iter()
        .enumerate()
        .filter(|(_, &(c, _))| c > 0)
        .map(|(i, &(c, n))| (1u64 << i, (1u64 << i).saturating_mul(2), c, n))
        .collect()
}

/// `part` as a percentage of `whole` (0 when `whole` is 0).
fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// The free-space histogram as a table, in the manner of `xfs_db freesp`
/// and `e2freefrag`: per bucket the range of extent lengths in blocks and
/// in bytes, the extents, their blocks and their share of the free blocks.
pub fn histogram_table(hist: &[(u64, u64, u64, u64)], block_size: u64) -> Vec<String> {
    let free: u64 = hist.iter().map(|&(_, _, _, n)| n).sum();
    let mut lines = vec![format!(
        "{:>14} {:>14} {:>11} {:>11} {:>12} {:>14} {:>9}",
        "from-blocks", "to-blocks", "from-bytes", "to-bytes", "extents", "blocks", "% of free"
    )];
    for &(lo, hi, c, n) in hist {
        let to = hi - 1;
        lines.push(format!(
            "{lo:>14} {to:>14} {:>11} {:>11} {c:>12} {n:>14} {:>8.2}%",
            units::bytes_wide(u128::from(lo) * u128::from(block_size)),
            units::bytes_wide(u128::from(to) * u128::from(block_size)),
            percent(n, free)
        ));
    }
    lines
}

/// The histogram's buckets as JSON: bounds in blocks and bytes (both
/// inclusive), counts, and the share of the free blocks.
fn histogram_json(hist: &[(u64, u64, u64, u64)], block_size: u64) -> Vec<serde_json::Value> {
    let free: u64 = hist.iter().map(|&(_, _, _, n)| n).sum();
    hist.iter()
        .map(|&(lo, hi, c, n)| {
            serde_json::json!({
                "min_blocks": lo,
                "max_blocks": hi - 1,
                "min_bytes": u128::from(lo) * u128::from(block_size),
                "max_bytes": u128::from(hi - 1) * u128::from(block_size),
                "extents": c,
                "blocks": n,
                "percent_of_free": percent(n, free),
            })
        })
        .collect()
}

fn slot_json(s: &SlotReport) -> serde_json::Value {
    match s {
        SlotReport::Empty => serde_json::json!({"state": "empty"}),
        SlotReport::Valid {
            seq,
            extents,
            payload_bytes,
        } => {
            serde_json::json!({"state": "valid", "seq": seq, "free_extents": extents, "payload_bytes": payload_bytes})
        }
        SlotReport::Damaged {
            reason,
            torn_by_crash,
        } => {
            serde_json::json!({"state": "damaged", "reason": reason, "torn_by_crash": torn_by_crash})
        }
    }
}

fn slot_text(s: &SlotReport) -> String {
    match s {
        SlotReport::Empty => "empty".into(),
        SlotReport::Valid {
            seq,
            extents,
            payload_bytes,
        } => format!(
            "checkpoint {seq}: {extents} free extents in {}",
            units::bytes(*payload_bytes)
        ),
        SlotReport::Damaged {
            reason,
            torn_by_crash,
        } => format!(
            "damaged{}: {reason}",
            if *torn_by_crash {
                " (torn by a crash)"
            } else {
                ""
            }
        ),
    }
}

/// Runs `inspect`.
///
/// # Errors
/// Store errors (not formatted, corrupt), I/O errors.
pub fn run(a: &InspectArgs) -> anyhow::Result<()> {
    let dev = std::sync::Arc::new(super::open_read_only(&a.device, a.direct)?);
    let writer = dev.writer();
    let (store, report) = Store::open_read_only(dev.clone())?;
    // A writer that started while recovery read counts too.
    let writer = writer.or_else(|| dev.writer());
    let writer_note = super::writer_note(&a.device, writer);
    let st = store.status();
    let l = store.layout();
    let free = store.committed_free_extents();
    let hist = histogram(free.iter().map(|e| e.len()));
    let j = st.journal;
    let sp = st.space;
    let bs = l.block_size;
    let end = match &report.journal_end {
        JournalEnd::Clean if report.closed_cleanly => "clean (closed cleanly)".to_string(),
        JournalEnd::Clean => "clean".to_string(),
        JournalEnd::TornTail { reason, seq, bytes } => format!(
            "damaged tail discarded (torn at a crash or damaged later): entry {seq}{} ({reason})",
            bytes.map_or(String::new(), |b| format!(", {}", units::bytes(b)))
        ),
        JournalEnd::Interrupted { reason, seq, bytes } => format!(
            "the write in flight at a crash discarded: entry {seq}{} ({reason})",
            bytes.map_or(String::new(), |b| format!(", {}", units::bytes(b)))
        ),
    };
    let discarded = super::discarded_entry(&report.journal_end);
    let zero = store.zero_progress();
    let json = JsonTarget::parse(a.json.as_deref())?;
    if let Some(target) = &json {
        let v = serde_json::json!({
            "zeroing": zero.as_ref().map(|z| serde_json::json!({
                "zeroed_through_block": z.position,
                "fraction": z.fraction(),
                "done": z.is_done(),
            })),
            "device": store.device().describe(),
            "capacity_bytes": sp.capacity_blocks * bs,
            "block_size": bs,
            "capacity_blocks": sp.capacity_blocks,
            "metadata_blocks": st.meta_blocks,
            "used_blocks": sp.used_blocks,
            "free_blocks": sp.free_blocks,
            "data_used_blocks": sp.used_blocks - st.meta_blocks,
            "utilization": sp.utilization(),
            "free_extents": sp.free_extents,
            "largest_free_extent_blocks": sp.largest_free_extent,
            "fragmentation": sp.fragmentation,
            "free_histogram": histogram_json(&hist, bs),
            "journal": {
                "bytes": l.journal_len,
                "ring_pages": j.ring_pages,
                "live_pages": j.live_pages,
                "pages_since_checkpoint": j.pages_since_checkpoint,
                "next_seq": j.next_seq,
                "tail_pos": j.tail_pos,
                "checkpoint_interval_pages": j.checkpoint_interval_pages,
                "entries_replayed": report.entries,
                "txns_replayed": report.txns,
                "end": end,
                "tail_discarded": report.journal_end.tail_discarded(),
                "discarded_entry": discarded,
                "closed_cleanly": report.closed_cleanly,
            },
            "checkpoints": {
                "slot_bytes": l.slot_len,
                "used_slot": report.checkpoint.slot,
                "used_seq": report.checkpoint.seq,
                "slots": report.slots.iter().map(slot_json).collect::<Vec<_>>(),
                "fell_back": report.fell_back,
            },
            "superblock_copy": report.superblock_copy,
            "format_version": report.format_version,
            "problems": report.problems,
            "recovery_secs": report.elapsed.as_secs_f64(),
            "in_use_by_writer": writer.is_some(),
            "writer_pid": writer.and_then(|h| h.pid()),
            "notes": writer_note.iter().collect::<Vec<_>>(),
        });
        write_json_object(target, &v)?;
        if *target == JsonTarget::Stdout {
            return Ok(());
        }
    }
    outln!("{}", store.device().describe())?;
    if let Some(n) = &writer_note {
        outln!("  note           {n}")?;
    }
    let geo = store.geometry();
    outln!(
        "  geometry       {} in {} blocks of {}",
        units::bytes(geo.capacity_bytes()),
        geo.capacity_blocks(),
        units::bytes(geo.block_size())
    )?;
    outln!(
        "  metadata       {} blocks ({}): checkpoint slots of {}, journal of {}; format version {}{}",
        st.meta_blocks,
        units::bytes(st.meta_blocks * bs),
        units::bytes(l.slot_len),
        units::bytes(l.journal_len),
        report.format_version,
        if report.format_version < FORMAT_VERSION {
            " (a writable open upgrades it)"
        } else {
            ""
        }
    )?;
    outln!(
        "  used           {} blocks of data ({}), utilisation {:.4} (metadata included)",
        sp.used_blocks - st.meta_blocks,
        units::bytes((sp.used_blocks - st.meta_blocks) * bs),
        sp.utilization()
    )?;
    outln!(
        "  free           {} blocks ({}) in {} extents, largest {} blocks ({})",
        sp.free_blocks,
        units::bytes(sp.free_blocks * bs),
        sp.free_extents,
        sp.largest_free_extent,
        units::bytes(sp.largest_free_extent.saturating_mul(bs))
    )?;
    outln!(
        "  fragmentation  {:.4} (0 = every free run holds a 4 MiB object)",
        sp.fragmentation
    )?;
    if !hist.is_empty() {
        outln!(
            "  free space by extent length (blocks of {}):",
            units::bytes(bs)
        )?;
        for line in histogram_table(&hist, bs) {
            outln!("  {line}")?;
        }
    }
    if let Some(z) = &zero {
        outln!(
            "  zeroing        {}: {:.1} % of the data area zeroed in the background (through block {})",
            if z.is_done() { "done" } else { "under way" },
            z.fraction() * 100.0,
            z.position
        )?;
    }
    outln!(
        "  journal        {} of {} pages live, {} since the newest checkpoint (next one after {}); next entry {}",
        j.live_pages, j.ring_pages, j.pages_since_checkpoint, j.checkpoint_interval_pages, j.next_seq
    )?;
    for (i, s) in report.slots.iter().enumerate() {
        outln!("  slot {i}         {}", slot_text(s))?;
    }
    outln!(
        "  recovery       checkpoint {} (slot {}) + {} journal entries ({} transactions), journal end {end}, {}",
        report.checkpoint.seq,
        report.checkpoint.slot,
        report.entries,
        report.txns,
        units::duration(report.elapsed)
    )?;
    for p in &report.problems {
        outln!("  PROBLEM        {p}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_power_of_two() {
        let h = histogram([1, 2, 3, 4, 1024, 1025]);
        assert_eq!(
            h,
            vec![
                (1, 2, 1, 1),
                (2, 4, 2, 5),
                (4, 8, 1, 4),
                (1024, 2048, 2, 2049)
            ]
        );
        assert!(histogram([]).is_empty());
    }

    #[test]
    fn histogram_table_has_headers_byte_ranges_and_percent() {
        let lines = histogram_table(&histogram([1, 3, 4, 1024]), 4096);
        assert!(lines[0].contains("from-blocks") && lines[0].contains("% of free"));
        // 1 + 3 + 4 + 1024 = 1032 free blocks.
        assert!(
            lines[1].contains("4 KiB") && lines[1].contains("0.10%"),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].contains("8 KiB") && lines[2].contains("12 KiB"),
            "{}",
            lines[2]
        );
        assert!(
            lines[4].contains("4 MiB") && lines[4].contains("8.00 MiB"),
            "{}",
            lines[4]
        );
        assert!(lines[4].contains("99.22%"), "{}", lines[4]);
    }
}
