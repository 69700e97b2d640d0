//! # blockalloc-store
//!
//! A durable space allocator: a device — a regular file or a block device —
//! carries its own allocation metadata and survives `kill -9` and power loss
//! without leaking or double-allocating a block.
//!
//! * [`device`] — the narrow [`Device`](device::Device) trait (read, write,
//!   sync, size) with a file implementation (`O_DIRECT`, preallocation), an
//!   in-memory one and a fault-injecting one for crash tests.
//! * [`format`](mod@format) — the on-disk format, byte by byte: superblock, two
//!   checkpoint slots, the journal ring (also in `docs/design.md`).
//! * [`Store`] — format, open (recovery), transactions ([`Txn`]) with group
//!   commit, checkpoints; [`check()`] — a full read-only consistency check;
//!   [`Store::reconcile`] — frees what an embedder's object index does not
//!   own.
//! * [`zero`] — background zeroing of a device file's never-used space
//!   ahead of allocation, an opt-in thread ([`Store::start_zeroing`]).
//!
//! The engine is [`blockalloc::SegFitAllocator`]; this crate adds durability
//! around it.
//!
//! ## Semantics
//!
//! * Allocations and frees are grouped in transactions; [`Txn::commit`]
//!   returns once the transaction is durable. Concurrent committers share one
//!   journal write and one sync (group commit).
//! * An allocation not committed before a crash is free after recovery (no
//!   leak). Freed blocks are not handed out again until the free is durable
//!   (no double allocation after a crash).
//! * Recovery is the newest valid checkpoint plus the journal after it,
//!   stopping cleanly at a torn tail. Checkpoints are taken when the journal
//!   since the last one passes a quarter of the ring, which bounds recovery
//!   time, and on [`Store::close`].
//! * The store knows space, not objects. An embedder with its own object
//!   index keeps the two in step by ordering its writes: **allocate and
//!   commit before the index records the object; remove the object from the
//!   index before committing the free.** A crash between the steps then
//!   leaves space allocated that no object owns — never an indexed object
//!   whose space is free — and [`Store::reconcile`] frees that space given
//!   the index's extents (see [`reconcile`](mod@reconcile)).
//! * Damaged metadata is a [`StoreError::Corrupt`] naming the structure,
//!   never a panic and never a silent repair. A damaged (or wiped) newest
//!   checkpoint falls back to the older one plus the journal, and the
//!   [`RecoveryReport`] says so. Every journal sector carries a stamp and a
//!   checksum, so the write in flight at a crash, torn, is told from an
//!   entry damaged after it was written: the first is discarded and
//!   reported ([`JournalEnd::Interrupted`]), the second is an error.
//!   Stores of format version 1 are read as they are (a damaged last entry
//!   is [`JournalEnd::TornTail`]) and upgraded by a writable open.
//! * A device has one writer: [`device::FileDevice::open`] locks it, and a
//!   second writer gets [`StoreError::Busy`] naming the holder.
//!   [`Store::open_read_only`] (or any read-only device) recovers without
//!   ever writing, beside a running writer if need be.
//!
//! ## Example
//!
//! ```
//! use std::sync::Arc;
//! use blockalloc_store::{device::MemDevice, FormatOptions, Store};
//!
//! let dev = Arc::new(MemDevice::new(64 << 20));
//! let store = Store::format(dev.clone(), FormatOptions::default())?;
//!
//! let mut txn = store.begin();
//! let kept = txn.allocate(16, None)?;
//! txn.commit()?; // durable
//!
//! let mut txn = store.begin();
//! let lost = txn.allocate(16, None)?;
//! // The power goes now: `lost` was never committed.
//! let after_crash = MemDevice::from_image(dev.image());
//!
//! let (store, report) = Store::open(after_crash)?;
//! assert_eq!(report.txns, 1);
//! store.check_allocated(kept)?; // still allocated
//! assert!(store.check_allocated(lost).is_err()); // free again
//! assert_eq!(store.status().space.used_blocks, store.layout().meta_blocks + 16);
//! # Ok::<(), blockalloc_store::StoreError>(())
//! ```

#![deny(unsafe_code)]

mod check;
mod commit;
pub mod device;
mod error;
pub mod format;
mod ranges;
pub mod reconcile;
mod recovery;
mod reserve;
mod store;
mod sync;
mod txn;
mod writer;
pub mod zero;

pub use check::{check, CheckReport};
pub use error::{FreeConflict, Result, StoreError, Structure};
pub use format::JournalOp;
pub use reconcile::{ReconcileError, ReconcileOptions, ReconcileReport};
pub use recovery::{CheckpointRef, JournalEnd, RecoveryReport, SlotReport};
pub use reserve::Reservation;
pub use store::{is_formatted, Fence, FormatOptions, Store, StoreStats, StoreStatus, SyncObserver};
pub use txn::{CommitInfo, Txn};
pub use writer::JournalStatus;
pub use zero::{ZeroProgress, Zeroer};
