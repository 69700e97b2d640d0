//! Group commit, journal appends and checkpoints.
//!
//! **Group commit** (leader/follower): a committing thread queues its
//! transaction's encoded operations and waits. If no leader is active it
//! becomes the leader: it takes every queued transaction that fits in one
//! entry, writes the entry, syncs once, applies the effects (allocations
//! stop being *reserved*, frees enter the engine), posts the results and
//! steps down; a waiting thread then leads the next group. While one group
//! syncs, the next one gathers, so N committing threads share roughly one
//! sync per group instead of one each.
//!
//! **Journal space.** An entry goes at the tail, or at the next lap start
//! when it would cross the ring's end. Pages from `keep_from` (the start of
//! the *older* checkpoint's replay, so that a damaged newest checkpoint can
//! fall back to it) to the tail are live and never overwritten. One page is
//! kept spare for a checkpoint announcement. Entries are limited to a
//! quarter of the ring.
//!
//! **Checkpoints** happen when the journal since the newest checkpoint
//! passes the interval (a quarter of the ring by default), when an entry
//! does not fit, on `checkpoint()` and on `close()`:
//! 1. snapshot the committed free list (engine free ∪ reserved) and encode
//!    it, as an extent list or per chunk as lists and bitmaps, whichever is
//!    smaller ([`crate::format::free_space`]); slots sized at format hold
//!    any free space this way, and only a smaller slot from an earlier
//!    version can refuse it, which stops here (nothing written);
//! 2. append and sync a "checkpoint begins" entry;
//! 3. write the checkpoint to the slot not holding the newest checkpoint,
//!    sync;
//! 4. the old newest becomes the older checkpoint: `keep_from` advances to
//!    its replay start.
//!
//! The writer lock is held throughout, so no group is applied in between and
//! the snapshot is exactly the state after the last journaled entry.
//!
//! **Close** writes a final checkpoint whose announcement carries "close",
//! and after the checkpoint a close record (one page, its own sync): one
//! more write and sync per close, none per commit. The next writer's first
//! entry overwrites the record; recovery that finds it knows nothing was in
//! flight and the closing checkpoint was written whole.
//!
//! Any device error while writing poisons the store: the state of unsynced
//! writes is unknown, so only a reopen (recovery) can tell what is durable.

use std::collections::VecDeque;

use blockalloc::Allocator;

use crate::device::AlignedBuf;
use crate::error::{Result, StoreError};
use crate::format::{checkpoint, journal, journal_v1, JournalOp, FORMAT_VERSION_1, PAGE};
use crate::recovery::CheckpointRef;
use crate::store::{lock, Counters, Store};
use crate::txn::rollback_effects;
use crate::writer::{Outcome, Pending, Work, Writer};

/// The most bytes of a checkpoint announcement's own operations
/// ("checkpoint begins" and "close"), records aside.
const ANNOUNCEMENT_OPS: usize = 32;

/// An error for every other member of a failed group.
fn replicate(e: &StoreError) -> StoreError {
    match e {
        StoreError::JournalFull { reason } => StoreError::JournalFull {
            reason: reason.clone(),
        },
        StoreError::Poisoned { cause } => StoreError::Poisoned {
            cause: cause.clone(),
        },
        other => StoreError::Poisoned {
            cause: other.to_string(),
        },
    }
}

impl Store {
    /// Writes a checkpoint and, by that, lets recovery skip the journal.
    ///
    /// # Errors
    /// [`StoreError::CheckpointTooLarge`] (nothing is changed; only with the
    /// smaller slots of an earlier format, see [`Layout::from_sizes`](crate::format::Layout::from_sizes)), I/O
    /// errors (the store is then unusable), [`StoreError::Poisoned`].
    pub fn checkpoint(&self) -> Result<()> {
        self.check_writable("write a checkpoint")?;
        self.check_poison()?;
        let mut w = lock(&self.writer);
        self.write_checkpoint(&mut w)
    }

    /// Checkpoints and closes: the next open replays nothing, and finds the
    /// close record that says nothing was in flight (so damage at the
    /// journal's end is then reported as corruption, not taken for a torn
    /// write). Costs the checkpoint plus one page write and one sync.
    /// Dropping a store without `close` is safe (every commit is durable)
    /// but leaves the journal to replay. A read-only store closes without
    /// writing. A store shared between threads closes with
    /// [`close_shared`](Self::close_shared).
    ///
    /// # Errors
    /// As [`checkpoint`](Self::checkpoint).
    pub fn close(self) -> Result<()> {
        self.close_shared()
    }

    /// [`close`](Self::close) for a store shared between threads (an
    /// `Arc<Store>`): from then on every write (commit, checkpoint,
    /// reservation, reconcile) is refused with [`StoreError::Closed`] and
    /// writes nothing; reads still work, and the device stays claimed until
    /// the store is dropped. Closing again does nothing.
    ///
    /// # Errors
    /// As [`checkpoint`](Self::checkpoint); the store stays open then.
    pub fn close_shared(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let mut w = lock(&self.writer);
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        self.check_poison()?;
        self.write_closing_checkpoint(&mut w)?;
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Pages an entry with a payload of `len` bytes occupies, in this
    /// store's format.
    pub(crate) fn entry_pages(&self, len: usize) -> u64 {
        if self.sb.version == FORMAT_VERSION_1 {
            journal_v1::pages_for(len)
        } else {
            journal::pages_for(len)
        }
    }

    /// The largest payload of one entry.
    pub(crate) fn max_entry_payload(&self) -> usize {
        let pages = self.max_entry_pages();
        if self.sb.version == FORMAT_VERSION_1 {
            (pages * PAGE) as usize - journal_v1::JE_PAYLOAD_OFF
        } else {
            journal::max_payload(pages)
        }
    }

    /// One entry's bytes, in this store's format (version 1 only while an
    /// upgrade writes its checkpoints).
    fn encode_entry(&self, seq: u64, pos: u64, txns: u32, payload: &[u8]) -> AlignedBuf {
        if self.sb.version == FORMAT_VERSION_1 {
            journal_v1::encode_entry(seq, pos, self.sb.uuid_prefix(), txns, payload)
        } else {
            journal::encode_entry(seq, pos, &self.sb.uuid, txns, payload)
        }
    }

    /// Largest journal entry, in pages.
    pub(crate) fn max_entry_pages(&self) -> u64 {
        (self.sb.layout.journal_pages() / 4).max(1)
    }

    /// Commits one transaction's operations; see the module docs. On error
    /// the effects have been rolled back.
    pub(crate) fn submit(&self, work: Work) -> Result<(u64, u32)> {
        let mut out = self.submit_all(vec![work]);
        out.pop().expect("one outcome per transaction")
    }

    /// Commits transactions (encoded operations, allocations, frees)
    /// together: queued at once, so that as many as fit share one entry
    /// and one sync. Returns each one's outcome, in order; a failed one's
    /// effects have been rolled back.
    pub(crate) fn submit_all(&self, txns: Vec<Work>) -> Vec<Outcome> {
        // A store that cannot commit refuses every member: the first with
        // the error itself, the others with a copy.
        let mut first = self
            .check_writable("commit a transaction")
            .and_then(|()| self.check_poison())
            .err();
        let template = first.as_ref().map(replicate);
        let mut out: Vec<Option<Outcome>> = Vec::with_capacity(txns.len());
        let mut tickets = Vec::with_capacity(txns.len());
        let mut q = lock(&self.queue.q);
        for work in txns {
            let pages = self.entry_pages(work.payload.len());
            let early = match &template {
                Some(t) => Some(first.take().unwrap_or_else(|| replicate(t))),
                None if pages > self.max_entry_pages() => Some(StoreError::TxnTooLarge {
                    pages,
                    limit: self.max_entry_pages(),
                }),
                None => None,
            };
            if let Some(e) = early {
                rollback_effects(&mut lock(&self.state), &work.allocs, &work.frees);
                out.push(Some(Err(e)));
                continue;
            }
            let ticket = q.next_ticket;
            q.next_ticket += 1;
            q.pending.push_back(Pending { ticket, work });
            tickets.push((out.len(), ticket));
            out.push(None);
        }
        let mut waiting = tickets.len();
        while waiting > 0 {
            for (i, t) in &tickets {
                if out[*i].is_none() {
                    if let Some(r) = q.done.remove(t) {
                        out[*i] = Some(r);
                        waiting -= 1;
                    }
                }
            }
            if waiting == 0 {
                break;
            }
            if !q.leader {
                q.leader = true;
                let batch = self.take_batch(&mut q.pending);
                drop(q);
                let results = self.write_group(batch);
                q = lock(&self.queue.q);
                q.done.extend(results);
                q.leader = false;
                self.queue.cv.notify_all();
                continue;
            }
            q = self.queue.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        out.into_iter()
            .map(|o| o.expect("every transaction has its outcome"))
            .collect()
    }

    /// Takes queued transactions, in order, while they fit in one entry.
    fn take_batch(&self, pending: &mut VecDeque<Pending>) -> Vec<Pending> {
        let max = self.max_entry_payload();
        let mut size = 0;
        let mut batch = Vec::new();
        while let Some(p) = pending.front() {
            if !batch.is_empty() && size + p.work.payload.len() > max {
                break;
            }
            size += p.work.payload.len();
            batch.push(pending.pop_front().expect("front exists"));
        }
        batch
    }

    /// Writes one group as one entry and applies it. Returns each member's
    /// outcome.
    fn write_group(&self, batch: Vec<Pending>) -> Vec<(u64, Outcome)> {
        let mut w = lock(&self.writer);
        let mut payload = Vec::with_capacity(batch.iter().map(|p| p.work.payload.len()).sum());
        for p in &batch {
            payload.extend_from_slice(&p.work.payload);
        }
        let n = batch.len() as u32;
        // Room for the next checkpoint's announcement, which restates the
        // records (this group may add to them).
        let spare =
            self.entry_pages(ANNOUNCEMENT_OPS + lock(&self.state).records_bytes + payload.len());
        match self.append(&mut w, &payload, n, spare) {
            Ok(seq) => {
                {
                    let mut s = lock(&self.state);
                    for p in batch.iter() {
                        let w = &p.work;
                        for &e in &w.allocs {
                            s.reserved.cut(e);
                        }
                        for &e in &w.frees {
                            s.pending_free.cut(e);
                            s.engine
                                .free(e)
                                .expect("a validated pending free is allocated in the engine");
                        }
                        for (key, value) in &w.records {
                            s.set_record(key, value.clone());
                        }
                    }
                }
                Counters::add(&self.counters.commits, n as u64);
                if w.due() {
                    match self.write_checkpoint(&mut w) {
                        Ok(()) => {}
                        Err(StoreError::CheckpointTooLarge { .. }) => {
                            w.blocked_at = Some(w.j.tail_pos);
                        }
                        // The group is durable; the store is poisoned for
                        // what comes next.
                        Err(_) => {}
                    }
                }
                batch.iter().map(|p| (p.ticket, Ok((seq, n)))).collect()
            }
            Err(e) => {
                {
                    let mut s = lock(&self.state);
                    for p in &batch {
                        rollback_effects(&mut s, &p.work.allocs, &p.work.frees);
                    }
                }
                let template = replicate(&e);
                let mut out = Vec::with_capacity(batch.len());
                let mut members = batch.iter();
                if let Some(p) = members.next() {
                    out.push((p.ticket, Err(e)));
                }
                for p in members {
                    out.push((p.ticket, Err(replicate(&template))));
                }
                out
            }
        }
    }

    /// Appends one entry and syncs. `spare` pages must stay free after it;
    /// a checkpoint announcement (`spare == 0`) never forces a checkpoint.
    fn append(&self, w: &mut Writer, payload: &[u8], txns: u32, spare: u64) -> Result<u64> {
        // Checked under the writer lock: a commit queued before the close
        // must not overwrite the close record, nor a fenced owner write.
        self.check_open("commit a transaction")?;
        self.check_fence()?;
        let ring = self.sb.layout.journal_pages();
        let pages = self.entry_pages(payload.len());
        let mut forced = 0;
        let pos = loop {
            let pos = w.place(pages, ring);
            if pos + pages + spare <= w.j.keep_from + ring {
                break pos;
            }
            if forced == 2 || spare == 0 {
                return Err(StoreError::JournalFull {
                    reason: format!(
                        "an entry of {pages} pages does not fit even after two checkpoints"
                    ),
                });
            }
            forced += 1;
            self.write_checkpoint(w).map_err(|e| match e {
                StoreError::CheckpointTooLarge { .. } => StoreError::JournalFull {
                    reason: e.to_string(),
                },
                other => other,
            })?;
        };
        let seq = w.j.next_seq;
        let buf = self.encode_entry(seq, pos, txns, payload);
        let off = self.sb.layout.journal_offset() + (pos % ring) * PAGE;
        self.io(self.dev.write_at(off, buf.as_slice()), || {
            format!("while writing journal entry {seq}")
        })?;
        let t = std::time::Instant::now();
        self.io(self.dev.sync(), || {
            format!("while syncing journal entry {seq}")
        })?;
        if let Some(o) = self.observer.get() {
            o.journal_synced(txns, t.elapsed());
        }
        Counters::add(&self.counters.syncs, 1);
        Counters::add(&self.counters.entries, 1);
        Counters::add(&self.counters.journal_bytes, buf.len() as u64);
        w.j.tail_pos = pos + pages;
        w.j.next_seq = seq + 1;
        Ok(seq)
    }

    /// Maps a device error to a poisoning [`StoreError::Io`].
    fn io(&self, r: std::io::Result<()>, context: impl FnOnce() -> String) -> Result<()> {
        r.map_err(|e| {
            let err = StoreError::io(context(), e);
            self.set_poison(&err);
            err
        })
    }

    /// Writes a checkpoint; see the module docs.
    pub(crate) fn write_checkpoint(&self, w: &mut Writer) -> Result<()> {
        self.write_checkpoint_as(w, false)
    }

    /// Writes the final checkpoint of a clean close, with its close record
    /// (see [`crate::format::journal`]): the announcement (carrying "close"),
    /// sync; the checkpoint, sync; the close record at the next page, sync.
    /// The close record follows the checkpoint, so it proves the checkpoint
    /// was written whole.
    pub(crate) fn write_closing_checkpoint(&self, w: &mut Writer) -> Result<()> {
        let ring = self.sb.layout.journal_pages();
        // The announcement and the close record; each plain checkpoint
        // moves `keep_from` forward and frees journal space.
        let pages = self.entry_pages(ANNOUNCEMENT_OPS + lock(&self.state).records_bytes);
        for _ in 0..2 {
            if w.place(pages, ring) + pages < w.j.keep_from + ring {
                break;
            }
            self.write_checkpoint(w)?;
        }
        self.write_checkpoint_as(w, true)
    }

    /// Writes and syncs the close record, entry `entry` at the tail. Not an
    /// entry the tail moves past: the next writer's first entry takes its
    /// sequence number and page.
    fn write_close_record(&self, w: &Writer, entry: u64, slot: u32, seq: u64) -> Result<()> {
        let l = self.sb.layout;
        let ring = l.journal_pages();
        let mut record = Vec::new();
        JournalOp::Close { slot, seq }.encode(&mut record);
        let pos = w.j.tail_pos;
        let buf = self.encode_entry(entry, pos, 0, &record);
        self.io(
            self.dev
                .write_at(l.journal_offset() + (pos % ring) * PAGE, buf.as_slice()),
            || format!("while writing the close record (entry {entry})"),
        )?;
        self.io(self.dev.sync(), || "while syncing the close record".into())?;
        Counters::add(&self.counters.syncs, 1);
        Counters::add(&self.counters.journal_bytes, buf.len() as u64);
        Ok(())
    }

    fn write_checkpoint_as(&self, w: &mut Writer, closing: bool) -> Result<()> {
        self.check_poison()?;
        self.check_fence()?;
        let l = self.sb.layout;
        let ring = l.journal_pages();
        let slot = 1 - w.j.newest.slot;
        let seq = w.j.next_checkpoint_seq;
        // The announcement restates the records (as the writer lock holds
        // them: exactly those of the entries written so far).
        let mut marker = Vec::new();
        JournalOp::CheckpointBegin { slot, seq }.encode(&mut marker);
        if closing {
            JournalOp::Close { slot, seq }.encode(&mut marker);
        }
        for (key, value) in &lock(&self.state).records {
            crate::format::journal::encode_put(&mut marker, key, value);
        }
        let pages = self.entry_pages(marker.len());
        let marker_pos = w.place(pages, ring);
        if closing && marker_pos + pages + 1 > w.j.keep_from + ring {
            return Err(StoreError::JournalFull {
                reason: "no room for the close record even after two checkpoints".into(),
            });
        }
        let stamp = checkpoint::Stamp {
            slot,
            uuid: self.sb.uuid,
            seq,
            journal_seq: w.j.next_seq + 1,
            journal_pos: marker_pos + pages,
        };
        let buf = checkpoint::encode(&stamp, &self.committed_free_extents(), &l).map_err(|t| {
            StoreError::CheckpointTooLarge {
                needed: t.needed,
                available: t.available,
            }
        })?;
        let mseq = self.append(w, &marker, 0, 0)?;
        debug_assert_eq!(w.j.tail_pos, marker_pos + pages);
        // Version 1 writes the close record before the checkpoint (its
        // recovery expects that order); version 2 after, so that the record
        // proves the checkpoint whole.
        let v1 = self.sb.version == FORMAT_VERSION_1;
        if closing && v1 {
            self.write_close_record(w, mseq + 1, slot, seq)?;
        }
        self.io(
            self.dev
                .write_at(l.slot_offset(slot as usize), buf.as_slice()),
            || format!("while writing checkpoint {seq} to slot {slot}"),
        )?;
        self.io(self.dev.sync(), || {
            format!("while syncing checkpoint {seq} in slot {slot}")
        })?;
        Counters::add(&self.counters.syncs, 1);
        Counters::add(&self.counters.checkpoints, 1);
        Counters::add(&self.counters.checkpoint_bytes, buf.len() as u64);
        if closing && !v1 {
            self.write_close_record(w, mseq + 1, slot, seq)?;
        }
        w.j.keep_from = w.j.newest.journal_pos;
        w.j.newest = CheckpointRef {
            slot,
            seq,
            journal_seq: mseq + 1,
            journal_pos: w.j.tail_pos,
        };
        w.j.next_checkpoint_seq = seq + 1;
        w.blocked_at = None;
        Ok(())
    }
}
