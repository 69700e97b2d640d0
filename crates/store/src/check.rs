//! [`check()`]: a full, read-only consistency check of a device.
//!
//! It recovers the committed state as `open` would, then checks what
//! recovery does not need to:
//!
//! * both superblock copies are valid and identical;
//! * both checkpoint slots are valid (or empty, or torn by a crash, which the
//!   journal proves); their free lists decode;
//! * recovering from the **older** checkpoint and replaying the longer
//!   journal reaches exactly the same free list as the newest checkpoint
//!   plus its journal;
//! * the engine's invariants hold (`verify`) and the metadata area is
//!   allocated.
//!
//! A problem is something damaged or contradictory; a note is a normal
//! after-crash state (a torn journal tail, a torn checkpoint write) or a
//! limit of the format worth knowing (checkpoint slots smaller than the
//! worst case, from an earlier format). A write torn at a crash and
//! discarded ([`JournalEnd::Interrupted`]) is a note; a damaged journal entry
//! recovery needs is an error. A store of format version 1 cannot tell the
//! two apart at its journal's end: there a discarded tail is a note and also
//! [`CheckReport::journal_tail_discarded`].

use blockalloc::{Allocator, FromFreeExtents, SegFitAllocator, Status};

use crate::device::Device;
use crate::error::Result;
use crate::format::checkpoint::{self, SlotState};
use crate::format::Superblock;
use crate::recovery::{self, CheckpointRef, JournalEnd, RecoveryReport, SlotReport};

/// What [`check()`] found.
#[derive(Clone, Debug)]
pub struct CheckReport {
    /// The superblock used.
    pub superblock: Superblock,
    /// What recovery did.
    pub recovery: RecoveryReport,
    /// Space accounting of the recovered state.
    pub space: Status,
    /// Damage or contradictions. Empty means consistent.
    pub problems: Vec<String>,
    /// Normal after-crash states worth knowing.
    pub notes: Vec<String>,
}

impl CheckReport {
    /// True when no problem was found.
    pub fn is_consistent(&self) -> bool {
        self.problems.is_empty()
    }

    /// True when recovery discarded a damaged entry at the journal's end
    /// (see [`JournalEnd::TornTail`]): consistent, but a committed
    /// transaction may have been lost if the damage was not a crash.
    pub fn journal_tail_discarded(&self) -> bool {
        self.recovery.journal_end.tail_discarded()
    }
}

/// Checks `dev` without writing to it.
///
/// # Errors
/// When the committed state cannot be recovered at all
/// ([`crate::StoreError::Corrupt`], [`crate::StoreError::NotFormatted`]) and
/// on I/O errors. Everything recovery survives is reported in
/// [`CheckReport::problems`] instead.
pub fn check(dev: &dyn Device) -> Result<CheckReport> {
    let rec = recovery::recover(dev)?;
    let sb = rec.sb;
    let l = sb.layout;
    let mut problems = rec.report.problems.clone();
    let mut notes = Vec::new();
    match &rec.report.journal_end {
        JournalEnd::TornTail { reason, seq, bytes } => notes.push(format!(
            "the journal ends with a torn entry, discarded: entry {seq}{}: {reason} \
             (the write in flight at a crash, or a committed entry damaged later: \
             format version 1 cannot tell the two apart)",
            bytes.map_or(String::new(), |b| format!(" of {b} bytes"))
        )),
        JournalEnd::Interrupted { reason, seq, bytes } => notes.push(format!(
            "the write in flight at a crash was discarded: entry {seq}{}: {reason} \
             (every sector intact: it was never acknowledged, nothing committed is lost)",
            bytes.map_or(String::new(), |b| format!(" of {b} bytes"))
        )),
        JournalEnd::Clean => {}
    }
    if rec.report.upgrade_unfinished {
        notes.push(
            "an upgrade to the current format version stopped between the two superblock \
             copies (copy 1 still names version 1); the state is intact and the next writable \
             open finishes it"
                .into(),
        );
    }
    for (i, s) in rec.report.slots.iter().enumerate() {
        if let SlotReport::Damaged {
            reason,
            torn_by_crash: true,
        } = s
        {
            notes.push(format!(
                "checkpoint slot {i} was being written at a crash (torn; the other slot was used): {reason}"
            ));
        }
    }
    if !l.slots_hold_any_checkpoint() {
        notes.push(format!(
            "checkpoint slots of {} bytes are smaller than the largest checkpoint of this \
             device ({} bytes; sized by an earlier format): if free space fragments so far that \
             neither encoding fits, checkpoints are refused and commits stop once the journal \
             fills; a store formatted by this version has no such limit",
            l.slot_len,
            checkpoint::max_len(l.capacity_blocks)
        ));
    }
    if let Err(e) = rec.engine.verify() {
        problems.push(format!("recovered engine: {e}"));
    }
    let free = rec.engine.free_extents();
    if free.first().is_some_and(|e| e.start() < l.meta_blocks) {
        problems.push("free space reaches into the metadata area".into());
    }
    // Cross-check from the other checkpoint.
    let headers = recovery::read_slot_headers(dev, &sb)?;
    let used = rec.report.checkpoint;
    for st in &headers {
        let SlotState::Valid(h) = st else { continue };
        if h.slot == used.slot {
            continue;
        }
        if h.seq > used.seq {
            continue; // damaged payload; already a problem
        }
        let other = CheckpointRef::from(h);
        match recovery::read_free_list(dev, &sb, h)? {
            Err(why) if rec.report.interrupted_checkpoint_slot == Some(h.slot) => notes.push(
                format!(
                    "checkpoint slot {} was being overwritten at a crash (torn; the other slot was used): {why}",
                    h.slot
                ),
            ),
            Err(why) => problems.push(format!("checkpoint slot {}: {why}", h.slot)),
            Ok(list) => match SegFitAllocator::from_free_extents(l.capacity_blocks, &list) {
                Err(e) => problems.push(format!("checkpoint slot {}: {e}", h.slot)),
                Ok(mut engine) => {
                    let ring = recovery::read_ring(dev, &l)?;
                    match recovery::replay(ring.as_slice(), &sb, &other, &mut engine) {
                        Err(e) => problems.push(format!(
                            "replaying the journal from the older checkpoint (slot {}): {e}",
                            h.slot
                        )),
                        Ok(_) if engine.free_extents() != free => problems.push(format!(
                            "the older checkpoint (slot {}) plus the journal disagrees with the newest checkpoint plus the journal",
                            h.slot
                        )),
                        Ok(_) => {}
                    }
                }
            },
        }
    }
    Ok(CheckReport {
        superblock: sb,
        space: rec.engine.status(),
        recovery: rec.report,
        problems,
        notes,
    })
}
