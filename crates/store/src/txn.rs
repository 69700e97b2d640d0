//! [`Txn`]: a group of allocations and frees that becomes durable at once.
//!
//! * `allocate` takes blocks from the engine at once (no other transaction
//!   can get them) and records them as *reserved*: a checkpoint taken while
//!   the transaction is open counts them as free, so a crash before the
//!   commit leaks nothing.
//! * `free` only validates and records: the blocks must be allocated in the
//!   committed state, not reserved by an open transaction and not already
//!   being freed. They stay allocated in the engine until the commit is
//!   durable, so they cannot be handed out again before the free would
//!   survive a crash (ZFS and XFS defer reuse the same way).
//! * `commit` writes one journal record (shared with concurrent commits) and
//!   returns once it is durable; then the frees enter the engine.
//! * `abort`, or dropping the transaction, returns its allocations to the
//!   engine and forgets its frees.

use blockalloc::{Allocator, Extent, FreeError};

use crate::error::{FreeConflict, Result, StoreError};
use crate::format::JournalOp;
use crate::format::Layout;
use crate::store::{lock, AllocState, Store};
use crate::writer::{RecordChange, Work};

/// What a commit did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitInfo {
    /// Sequence number of the journal entry holding the transaction (0 for
    /// an empty transaction, which writes nothing).
    pub seq: u64,
    /// Transactions that shared the entry and its sync (1 when alone).
    pub group: u32,
    /// Extents allocated.
    pub allocs: usize,
    /// Extents freed.
    pub frees: usize,
}

/// An open transaction. See the [crate documentation](crate).
#[derive(Debug)]
#[must_use = "a transaction is aborted when dropped; call commit()"]
pub struct Txn<'s> {
    pub(crate) store: &'s Store,
    pub(crate) allocs: Vec<Extent>,
    pub(crate) frees: Vec<Extent>,
    /// Record changes, in order.
    records: Vec<RecordChange>,
    finished: bool,
}

/// Validates a free against the committed state (see [`Txn::free`]).
pub(crate) fn check_free(s: &AllocState, layout: &Layout, extent: Extent) -> Result<()> {
    if extent.start() < layout.meta_blocks {
        return Err(StoreError::FreeMetadata {
            extent,
            meta_blocks: layout.meta_blocks,
        });
    }
    s.engine.check_allocated(extent)?;
    if let Some(overlap) = s.reserved.overlap(extent) {
        return Err(StoreError::FreeConflict {
            extent,
            overlap,
            conflict: FreeConflict::Uncommitted,
        });
    }
    if let Some(overlap) = s.pending_free.overlap(extent) {
        return Err(StoreError::FreeConflict {
            extent,
            overlap,
            conflict: FreeConflict::PendingFree,
        });
    }
    Ok(())
}

impl Store {
    /// Starts a transaction.
    pub fn begin(&self) -> Txn<'_> {
        lock(&self.state).open_txns += 1;
        Txn::new(self)
    }

    /// `Ok` when every block of `extent` is allocated in the committed state
    /// and not being freed: [`Txn::free`] would accept it.
    ///
    /// # Errors
    /// As [`Txn::free`].
    pub fn check_allocated(&self, extent: Extent) -> Result<()> {
        check_free(&lock(&self.state), &self.sb.layout, extent)
    }
    /// Makes `txns` durable together, as concurrent commits would be: as
    /// many as fit share one journal entry and one sync. Returns each one's
    /// outcome, in order, as [`Txn::commit`] would (a transaction of
    /// another store is committed there, on its own).
    ///
    /// This is how a single thread that gathered the work of many callers
    /// commits it in one write, without a thread per transaction.
    ///
    /// # Errors
    /// Per transaction, those of [`Txn::commit`].
    pub fn commit_all<'a>(&'a self, txns: Vec<Txn<'a>>) -> Vec<Result<CommitInfo>> {
        let mut out: Vec<Option<Result<CommitInfo>>> = Vec::with_capacity(txns.len());
        let mut work = Vec::new();
        let mut at = Vec::new();
        let mut opened = 0;
        for mut t in txns {
            if !std::ptr::eq(t.store, self) {
                out.push(Some(t.commit()));
                continue;
            }
            opened += 1;
            match t.take_work() {
                None => out.push(Some(Ok(CommitInfo {
                    seq: 0,
                    group: 0,
                    allocs: 0,
                    frees: 0,
                }))),
                Some(w) => {
                    at.push((out.len(), w.allocs.len(), w.frees.len()));
                    work.push(w);
                    out.push(None);
                }
            }
        }
        let results = if work.is_empty() {
            Vec::new()
        } else {
            self.submit_all(work)
        };
        lock(&self.state).open_txns -= opened;
        for ((i, na, nf), r) in at.into_iter().zip(results) {
            out[i] = Some(r.map(|(seq, group)| CommitInfo {
                seq,
                group,
                allocs: na,
                frees: nf,
            }));
        }
        out.into_iter()
            .map(|o| o.expect("every transaction has its outcome"))
            .collect()
    }
}

impl<'s> Txn<'s> {
    pub(crate) fn new(store: &'s Store) -> Self {
        Txn {
            store,
            allocs: Vec::new(),
            frees: Vec::new(),
            records: Vec::new(),
            finished: false,
        }
    }

    /// Allocates `len` contiguous blocks, near `hint` if possible (see
    /// [`blockalloc::Allocator::allocate`]).
    ///
    /// # Errors
    /// [`StoreError::Alloc`] (no space, zero length, bad hint),
    /// [`StoreError::Poisoned`]. The transaction stays usable.
    pub fn allocate(&mut self, len: u64, hint: Option<u64>) -> Result<Extent> {
        self.store.check_poison()?;
        let mut s = lock(&self.store.state);
        let e = s.engine.allocate(len, hint)?;
        s.reserved.insert(e);
        drop(AllocState::took(s, self.store, &[e]));
        self.allocs.push(e);
        Ok(e)
    }

    /// Allocates an extent for each length of `lens`, in order, as many
    /// calls of [`allocate`](Self::allocate) would, taking the store's
    /// lock once: the first near `hint`, each next one near the end of the
    /// one before when a hint is given. Appends them to `out`.
    ///
    /// # Errors
    /// As [`allocate`](Self::allocate), for the first allocation that
    /// fails: the ones before it stay in the transaction (and in `out`).
    pub fn allocate_each(
        &mut self,
        lens: &[u64],
        mut hint: Option<u64>,
        out: &mut Vec<Extent>,
    ) -> Result<()> {
        self.store.check_poison()?;
        let mut s = lock(&self.store.state);
        let first = out.len();
        let mut r = Ok(());
        for &len in lens {
            match s.engine.allocate(len, hint) {
                Ok(e) => {
                    s.reserved.insert(e);
                    self.allocs.push(e);
                    out.push(e);
                    hint = hint.map(|_| e.end());
                }
                Err(e) => {
                    r = Err(e.into());
                    break;
                }
            }
        }
        drop(AllocState::took(s, self.store, &out[first..]));
        r
    }

    /// Allocates `len` blocks in as few extents as the engine finds,
    /// all or nothing.
    ///
    /// # Errors
    /// As [`allocate`](Self::allocate).
    pub fn allocate_scattered(&mut self, len: u64) -> Result<Vec<Extent>> {
        self.store.check_poison()?;
        let mut out = Vec::new();
        let mut s = lock(&self.store.state);
        s.engine.allocate_scattered(len, &mut out)?;
        for &e in &out {
            s.reserved.insert(e);
        }
        drop(AllocState::took(s, self.store, &out));
        self.allocs.extend_from_slice(&out);
        Ok(out)
    }

    /// Frees `extent` when the transaction commits. Any allocated extent
    /// works: a whole allocation, part of one, or adjacent ones together.
    ///
    /// # Errors
    /// [`StoreError::Free`] when part of it is free (double free) or past
    /// the device, [`StoreError::FreeMetadata`] for the metadata area,
    /// [`StoreError::FreeConflict`] when part of it is allocated by an open
    /// transaction (abort that one instead) or already being freed. The
    /// transaction stays usable.
    pub fn free(&mut self, extent: Extent) -> Result<()> {
        self.store.check_poison()?;
        let mut s = lock(&self.store.state);
        check_free(&s, &self.store.sb.layout, extent)?;
        s.pending_free.insert(extent);
        drop(s);
        self.frees.push(extent);
        Ok(())
    }

    /// Sets the record `key` to `value` when the transaction commits (see
    /// [`Store::records`]): records change atomically with the
    /// transaction's allocations and frees.
    ///
    /// # Errors
    /// [`StoreError::BadRecord`] for an empty key or one longer than
    /// [`MAX_KEY`](crate::format::journal::MAX_KEY) bytes, or when the
    /// table would grow past [`Store::records_limit`] bytes; nothing is
    /// changed and the transaction stays usable.
    pub fn put_record(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.store.check_record_key(key)?;
        let limit = self.store.records_limit();
        let s = lock(&self.store.state);
        // The table's size once this transaction is applied: each key it
        // changes counts with its last value instead of its committed one.
        let mut last: std::collections::BTreeMap<&[u8], Option<&[u8]>> = self
            .records
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_deref()))
            .collect();
        last.insert(key, Some(value));
        let mut size = s.records_bytes;
        for (k, v) in last {
            size -= s.records.get(k).map_or(0, |old| JournalOp::put_len(k, old));
            size += v.map_or(0, |v| JournalOp::put_len(k, v));
        }
        drop(s);
        if size > limit {
            return Err(StoreError::BadRecord {
                reason: format!(
                    "the records would take {size} bytes, more than this store's limit of \
                     {limit} (half of its largest journal entry)"
                ),
            });
        }
        self.records.push((key.to_vec(), Some(value.to_vec())));
        Ok(())
    }

    /// Deletes the record `key` (if there is one) when the transaction
    /// commits.
    ///
    /// # Errors
    /// [`StoreError::BadRecord`] for a bad key (as
    /// [`put_record`](Self::put_record)).
    pub fn delete_record(&mut self, key: &[u8]) -> Result<()> {
        self.store.check_record_key(key)?;
        self.records.push((key.to_vec(), None));
        Ok(())
    }

    /// Puts one of the store's own records (a key starting with a zero
    /// byte, a few bytes long: it fits beside the user's table).
    pub(crate) fn put_store_record(&mut self, key: &[u8], value: &[u8]) {
        debug_assert!(crate::store::is_store_key(key));
        self.records.push((key.to_vec(), Some(value.to_vec())));
    }

    /// The store the transaction commits to.
    pub fn store(&self) -> &'s Store {
        self.store
    }

    /// Extents allocated so far.
    pub fn allocations(&self) -> &[Extent] {
        &self.allocs
    }

    /// Extents to be freed.
    pub fn frees(&self) -> &[Extent] {
        &self.frees
    }

    /// Makes the transaction durable; returns once it is. Concurrent commits
    /// share one journal write and one sync.
    ///
    /// # Errors
    /// [`StoreError::TxnTooLarge`] or [`StoreError::JournalFull`] (the
    /// transaction is aborted), I/O errors (the store becomes unusable; the
    /// transaction may or may not be durable — reopen to find out),
    /// [`StoreError::Poisoned`].
    pub fn commit(self) -> Result<CommitInfo> {
        self.store
            .commit_all(vec![self])
            .pop()
            .expect("one outcome")
    }

    /// The encoded operations, allocations, frees and record changes of a
    /// transaction to commit; `None` for an empty one (finished here).
    fn take_work(&mut self) -> Option<Work> {
        self.finished = true;
        if self.allocs.is_empty() && self.frees.is_empty() && self.records.is_empty() {
            return None;
        }
        let mut payload = Vec::with_capacity((self.allocs.len() + self.frees.len()) * 9);
        for &e in &self.allocs {
            JournalOp::Alloc(e).encode(&mut payload);
        }
        for &e in &self.frees {
            JournalOp::Free(e).encode(&mut payload);
        }
        for (key, value) in &self.records {
            match value {
                Some(value) => crate::format::journal::encode_put(&mut payload, key, value),
                None => JournalOp::Delete { key: key.clone() }.encode(&mut payload),
            }
        }
        Some(Work {
            payload,
            allocs: std::mem::take(&mut self.allocs),
            frees: std::mem::take(&mut self.frees),
            records: std::mem::take(&mut self.records),
        })
    }

    /// Returns the allocations to free space and drops the frees.
    pub fn abort(mut self) {
        self.rollback();
    }

    /// Frees each extent of `extents` when the transaction commits, as
    /// many calls of [`free`](Self::free) would, taking the store's lock
    /// once.
    ///
    /// # Errors
    /// As [`free`](Self::free), for the first extent refused: the ones
    /// before it stay in the transaction.
    pub fn free_each(&mut self, extents: &[Extent]) -> Result<()> {
        self.store.check_poison()?;
        let mut s = lock(&self.store.state);
        for &extent in extents {
            check_free(&s, &self.store.sb.layout, extent)?;
            s.pending_free.insert(extent);
            self.frees.push(extent);
        }
        Ok(())
    }

    fn rollback(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        let mut s = lock(&self.store.state);
        rollback_effects(&mut s, &self.allocs, &self.frees);
        s.open_txns -= 1;
    }
}

/// Undoes the in-memory effects of an uncommitted transaction.
pub(crate) fn rollback_effects(s: &mut AllocState, allocs: &[Extent], frees: &[Extent]) {
    for &e in allocs {
        s.reserved.cut(e);
        let r: std::result::Result<(), FreeError> = s.engine.free(e);
        r.expect("a reserved extent is allocated in the engine");
    }
    for &e in frees {
        s.pending_free.cut(e);
    }
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        self.rollback();
    }
}
