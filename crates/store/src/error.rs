//! Typed errors of the store. One umbrella [`StoreError`]; every message
//! names the structure, the blocks or the file involved, so that a user can
//! act on it without reading the code. Bad bytes from the device are always
//! an error value ([`StoreError::Corrupt`]), never a panic.

use std::error::Error as StdError;
use std::fmt;
use std::io;

use blockalloc::{AllocError, ErrorClass, Extent, FreeError};

use crate::device::{DeviceBusy, LockHolder};

/// A metadata structure, as named in errors and reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Structure {
    /// Superblock copy 0 or 1.
    Superblock {
        /// Which copy.
        copy: u8,
    },
    /// Checkpoint slot 0 or 1.
    Checkpoint {
        /// Which slot.
        slot: u8,
    },
    /// The journal entry with this sequence number.
    JournalEntry {
        /// Sequence number.
        seq: u64,
    },
    /// The record of background zeroing's position ([`crate::zero`]).
    ZeroingRecord,
}

impl fmt::Display for Structure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Structure::Superblock { copy } => write!(f, "superblock (copy {copy})"),
            Structure::Checkpoint { slot } => write!(f, "checkpoint (slot {slot})"),
            Structure::JournalEntry { seq } => write!(f, "journal entry {seq}"),
            Structure::ZeroingRecord => write!(f, "background zeroing record"),
        }
    }
}

/// Why a free was refused by a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FreeConflict {
    /// Part of the extent is already being freed by an open transaction
    /// (this one or another).
    PendingFree,
    /// Part of the extent was allocated by a transaction that has not
    /// committed (free it by aborting that transaction instead).
    Uncommitted,
}

impl fmt::Display for FreeConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FreeConflict::PendingFree => "is already being freed by an open transaction",
            FreeConflict::Uncommitted => {
                "was allocated by a transaction that has not committed (abort it instead)"
            }
        })
    }
}

/// Any error of the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The device failed an I/O request.
    #[error("I/O error {context}: {source}")]
    Io {
        /// What the store was doing.
        context: String,
        /// The device's error.
        #[source]
        source: io::Error,
    },
    /// Metadata read from the device is invalid.
    #[error("corrupt {structure} at byte {offset} of the device: {reason}")]
    Corrupt {
        /// Which structure.
        structure: Structure,
        /// Byte offset of the structure on the device.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// Both superblock copies are missing: the device was never formatted.
    #[error("{device} is not a blockalloc device (no superblock; format it first)")]
    NotFormatted {
        /// The device's description.
        device: String,
    },
    /// `format` found an existing store and was not told to overwrite it.
    #[error("{device} already holds a blockalloc store; format with force (`--force`) to overwrite it, losing every allocation on it")]
    AlreadyFormatted {
        /// The device's description.
        device: String,
    },
    /// Another writer holds the device (a device has one writer at a time).
    #[error("{device} is in use by another writer: held by {holder}; a device has one writer at a time (stop it first; inspect and check can read while it runs)")]
    Busy {
        /// The device's path or description.
        device: String,
        /// Who holds it, as far as the system tells.
        holder: LockHolder,
    },
    /// A write was asked of a store opened read-only; nothing was written.
    #[error("{device} is open read-only: cannot {action}")]
    ReadOnly {
        /// The device's description.
        device: String,
        /// What was refused.
        action: &'static str,
    },
    /// The device is smaller than its superblock says.
    #[error("the device has {actual} bytes but its superblock describes {expected} bytes: the file was truncated (or this is the wrong device)")]
    DeviceTooSmall {
        /// Bytes the superblock needs.
        expected: u64,
        /// Bytes the device has.
        actual: u64,
    },
    /// Format options that cannot describe a device.
    #[error("cannot format: {0}")]
    BadOptions(String),
    /// An allocation could not be served.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// A free was refused by the engine (out of range or not allocated).
    #[error(transparent)]
    Free(#[from] FreeError),
    /// A free was refused because of another transaction.
    #[error("cannot free {extent}: {overlap} {conflict}")]
    FreeConflict {
        /// The extent passed to `free`.
        extent: Extent,
        /// The conflicting part.
        overlap: Extent,
        /// What it conflicts with.
        conflict: FreeConflict,
    },
    /// A free names blocks of the metadata area.
    #[error("cannot free {extent}: blocks 0..{meta_blocks} hold the store's own metadata")]
    FreeMetadata {
        /// The extent passed to `free`.
        extent: Extent,
        /// Metadata blocks.
        meta_blocks: u64,
    },
    /// A publish names blocks outside the reservation's unpublished part
    /// (or the same blocks twice).
    #[error("cannot publish {extent}: it is not inside the unpublished part of the reservation (already published, outside the reservation, or named twice)")]
    NotReserved {
        /// The extent passed to `publish`.
        extent: Extent,
    },
    /// A record key or value the store refuses (see
    /// [`Txn::put_record`](crate::Txn::put_record)); nothing was changed.
    #[error("bad record: {reason}")]
    BadRecord {
        /// Why.
        reason: String,
    },
    /// A transaction's journal entry would not fit in the journal.
    #[error("transaction too large: its journal entry needs {pages} pages, at most {limit} fit (commit in smaller transactions)")]
    TxnTooLarge {
        /// Pages needed.
        pages: u64,
        /// Largest entry allowed.
        limit: u64,
    },
    /// The journal is full and no checkpoint could be written to free it.
    #[error("journal full: {reason}")]
    JournalFull {
        /// Why no checkpoint could free space.
        reason: String,
    },
    /// The free list does not fit in a checkpoint slot in either encoding.
    /// Only slots smaller than the worst case, sized by an earlier format,
    /// can refuse a checkpoint.
    #[error("checkpoint too large: {needed} bytes needed, slot holds {available} (free space is too fragmented for the checkpoint slots of an earlier format; the journal keeps working until it fills; freeing blocks next to free ones, or moving the data to a store formatted by this version, lifts the limit)")]
    CheckpointTooLarge {
        /// Bytes needed.
        needed: u64,
        /// Bytes per slot.
        available: u64,
    },
    /// [`Store::reconcile`](crate::Store::reconcile) refused or stopped.
    #[error(transparent)]
    Reconcile(#[from] ReconcileError),
    /// The store was closed ([`Store::close`](crate::Store::close)); it
    /// refuses further writes. Nothing was written.
    #[error("{device} is closed: cannot {action}")]
    Closed {
        /// The device's description.
        device: String,
        /// What was refused.
        action: &'static str,
    },
    /// The store's fence ([`Store::set_fence`](crate::Store::set_fence))
    /// says its owner may no longer own the device: nothing was written,
    /// nothing changed, and the store writes again once the fence lifts.
    #[error("{device}: not written, this owner is fenced (it may no longer own the device)")]
    Fenced {
        /// The device's description.
        device: String,
    },
    /// An earlier I/O failure left unsynced metadata in an unknown state; the
    /// store refuses further work. Reopen the device to recover.
    #[error("store unusable after an earlier I/O failure ({cause}); reopen the device to recover")]
    Poisoned {
        /// The first failure.
        cause: String,
    },
}

impl StoreError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        StoreError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn corrupt(structure: Structure, offset: u64, reason: impl fmt::Display) -> Self {
        StoreError::Corrupt {
            structure,
            offset,
            reason: reason.to_string(),
        }
    }

    /// The error for a device that could not be opened: [`StoreError::Busy`]
    /// when another writer holds it, else [`StoreError::Io`] naming the
    /// path.
    pub fn from_open(path: &std::path::Path, e: io::Error) -> Self {
        match DeviceBusy::from_io(&e) {
            Some(b) => StoreError::Busy {
                device: b.path.display().to_string(),
                holder: b.holder,
            },
            None => StoreError::io(format!("while opening {}", path.display()), e),
        }
    }

    /// True for errors that mean metadata on the device is damaged.
    pub fn is_corruption(&self) -> bool {
        matches!(self, StoreError::Corrupt { .. })
    }

    /// What kind of failure this is; see [`ErrorClass`].
    pub fn class(&self) -> ErrorClass {
        match self {
            StoreError::Io { .. } => ErrorClass::Io,
            StoreError::Corrupt { .. } => ErrorClass::Corrupt,
            StoreError::NotFormatted { .. } => ErrorClass::NotFormatted,
            StoreError::AlreadyFormatted { .. } => ErrorClass::AlreadyExists,
            StoreError::Busy { .. } => ErrorClass::Busy,
            StoreError::ReadOnly { .. } => ErrorClass::ReadOnly,
            StoreError::DeviceTooSmall { .. } => ErrorClass::Truncated,
            StoreError::BadOptions(_)
            | StoreError::TxnTooLarge { .. }
            | StoreError::BadRecord { .. } => ErrorClass::InvalidInput,
            StoreError::Alloc(e) => e.class(),
            StoreError::Free(e) => e.class(),
            StoreError::FreeConflict { .. }
            | StoreError::FreeMetadata { .. }
            | StoreError::NotReserved { .. } => ErrorClass::Conflict,
            // The journal keeps working after a refused checkpoint until it
            // fills; then commits wait for space like a full journal.
            StoreError::JournalFull { .. }
            | StoreError::CheckpointTooLarge { .. }
            | StoreError::Closed { .. }
            | StoreError::Fenced { .. }
            | StoreError::Poisoned { .. } => ErrorClass::Unavailable,
            StoreError::Reconcile(e) => e.class(),
        }
    }
}

/// Why [`Store::reconcile`](crate::Store::reconcile) refused or stopped. Every refusal of the
/// checking pass leaves the store unchanged.
///
/// `index` counts live extents from 1 in the order the stream yielded them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcileError {
    /// The index claims space the store holds as free: an object whose
    /// blocks could be handed to another one. Nothing is freed; find out
    /// how the index lost step before anything else allocates.
    #[error("live extent {index} ({extent}) is not allocated: {free} is free in the store, so the index names space the store may hand out again")]
    NotAllocated {
        /// Position in the stream.
        index: u64,
        /// The live extent.
        extent: Extent,
        /// Its first free part.
        free: Extent,
    },
    /// A live extent shares blocks with the one before it.
    #[error("live extent {index} ({extent}) overlaps the one before it ({previous}); two objects claim the same blocks")]
    Overlap {
        /// Position in the stream.
        index: u64,
        /// The live extent.
        extent: Extent,
        /// The extent before it.
        previous: Extent,
    },
    /// A live extent starts before the one listed ahead of it.
    #[error("live extent {index} ({extent}) starts before the one listed ahead of it ({previous}); list live extents in address order")]
    OutOfOrder {
        /// Position in the stream.
        index: u64,
        /// The live extent.
        extent: Extent,
        /// The extent before it.
        previous: Extent,
    },
    /// A live extent lies (partly) in the store's metadata area.
    #[error("live extent {index} ({extent}) lies in the metadata area (blocks 0..{meta_blocks}), which no object can own")]
    Metadata {
        /// Position in the stream.
        index: u64,
        /// The live extent.
        extent: Extent,
        /// Metadata blocks.
        meta_blocks: u64,
    },
    /// A live extent ends past the device.
    #[error("live extent {index} ({extent}) ends past the device ({capacity} blocks)")]
    OutOfRange {
        /// Position in the stream.
        index: u64,
        /// The live extent.
        extent: Extent,
        /// Device size in blocks.
        capacity: u64,
    },
    /// The stream of live extents failed (a read or parse error).
    #[error("cannot read live extent {index}: {source}")]
    Source {
        /// Position in the stream.
        index: u64,
        /// The stream's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// Transactions were open when reconcile was asked to start.
    #[error("{open_txns} transaction(s) are open; reconcile needs the store to itself (commit or abort them first)")]
    Busy {
        /// Open transactions.
        open_txns: u64,
    },
    /// Another transaction was opened or committed while reconcile ran.
    #[error("another transaction ran during reconcile; {freed_extents} extents ({freed_blocks} blocks) freed before it stay free; run reconcile again once nothing else uses the store")]
    Interrupted {
        /// Extents freed and committed before stopping.
        freed_extents: u64,
        /// Blocks in them.
        freed_blocks: u64,
    },
    /// The second stream of live extents differs from the first one.
    #[error("the live extents changed between the checking and the freeing pass ({reason}); {freed_extents} extents ({freed_blocks} blocks) freed before that stay free; keep the index still while reconcile runs")]
    Changed {
        /// What differed.
        reason: String,
        /// Extents freed and committed before stopping.
        freed_extents: u64,
        /// Blocks in them.
        freed_blocks: u64,
    },
}

impl ReconcileError {
    /// What kind of failure this is: [`ErrorClass::InvalidInput`] for
    /// malformed live extents ([`is_bad_input`](Self::is_bad_input)),
    /// [`ErrorClass::Corrupt`] for an index that names free space,
    /// [`ErrorClass::Conflict`] when other transactions got in the way.
    pub fn class(&self) -> ErrorClass {
        match self {
            ReconcileError::NotAllocated { .. } => ErrorClass::Corrupt,
            ReconcileError::Busy { .. }
            | ReconcileError::Interrupted { .. }
            | ReconcileError::Changed { .. } => ErrorClass::Conflict,
            ReconcileError::Overlap { .. }
            | ReconcileError::OutOfOrder { .. }
            | ReconcileError::Metadata { .. }
            | ReconcileError::OutOfRange { .. }
            | ReconcileError::Source { .. } => ErrorClass::InvalidInput,
        }
    }

    /// True when the live extents themselves are malformed (out of order,
    /// overlapping, in the metadata area, past the device, unreadable):
    /// bad input, as opposed to an index that disagrees with the store
    /// ([`NotAllocated`](Self::NotAllocated)) or a store in use.
    pub fn is_bad_input(&self) -> bool {
        self.class() == ErrorClass::InvalidInput
    }
}

/// Result alias of this crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_is_wrong() {
        let e = StoreError::corrupt(Structure::Checkpoint { slot: 1 }, 8192, "bad crc");
        assert_eq!(
            e.to_string(),
            "corrupt checkpoint (slot 1) at byte 8192 of the device: bad crc"
        );
        assert!(e.is_corruption());
        let e = StoreError::FreeConflict {
            extent: Extent::new(1, 2).unwrap(),
            overlap: Extent::new(2, 1).unwrap(),
            conflict: FreeConflict::PendingFree,
        };
        assert!(e.to_string().contains("already being freed"));
        assert_eq!(
            Structure::JournalEntry { seq: 5 }.to_string(),
            "journal entry 5"
        );
        assert_eq!(
            Structure::Superblock { copy: 0 }.to_string(),
            "superblock (copy 0)"
        );
    }
}
