//! [`Store::reconcile`]: frees every committed allocation that the caller's
//! object index does not own.
//!
//! The store knows free space, not objects. An embedder keeps its own index
//! (object → extents) and orders its writes so that a crash can only leak:
//!
//! 1. **create**: allocate and [`commit`](crate::Txn::commit) the space, then
//!    record the object in the index;
//! 2. **delete**: remove the object from the index, then free its space and
//!    commit the free.
//!
//! A crash between the two steps of either leaves space allocated that no
//! object owns, never an object whose space is free. Reconcile closes that
//! gap: given the index's extents in address order, it frees every
//! committed allocation outside them (the metadata area excepted).
//!
//! How a run goes:
//!
//! * **checking pass**: the live extents are streamed once and merged with
//!   the committed free list, walked in address order (one `O(log F)` lookup
//!   per free extent or live extent met). Every live extent must be in
//!   order, disjoint from the one before, outside the metadata area, inside
//!   the device and wholly allocated; the first that is not is a typed
//!   [`ReconcileError`] and nothing has changed. A dry run stops here and
//!   reports what it would free.
//! * **freeing pass**: the live extents are streamed a second time (the
//!   caller's closure makes a fresh stream) and the same walk frees what no
//!   live extent covers, committing the frees in batches of at most
//!   [`ReconcileOptions::batch_extents`] extents (each batch is one journal
//!   entry, so a huge device never needs one giant transaction). If the
//!   second stream differs from the first, the run stops with
//!   [`ReconcileError::Changed`]; the batches committed before are kept.
//!
//! Memory is bounded by one batch: neither the live extents nor the free
//! list are ever held whole.
//!
//! Reconcile needs the store to itself: it refuses to start while a
//! transaction is open ([`ReconcileError::Busy`]), and it stops with
//! [`ReconcileError::Interrupted`] at its next step when another
//! transaction has been opened or committed meanwhile (that transaction's
//! allocations would be missing from the live extents it was given). Frees
//! it committed before stopping are kept. Allocations of transactions that
//! opened meanwhile count as free (committed state), so reconcile never
//! frees them, and its own pending frees are marked like a transaction's,
//! so nobody else can free the same blocks concurrently.

use std::error::Error as StdError;

use blockalloc::{Extent, FreeError};

pub use crate::error::ReconcileError;
use crate::error::{Result, StoreError};
use crate::format::JournalOp;
use crate::store::{lock, AllocState, Store};

/// The most bytes one free operation takes in a journal entry (an opcode
/// and two 10-byte varints).
const MAX_FREE_OP_BYTES: usize = 21;

/// Free-list lookups per hold of the state lock while sweeping a long gap,
/// so that a transaction begun meanwhile (which will make the run stop)
/// does not wait for the whole gap.
const LOOKUPS_PER_LOCK: usize = 4096;

/// How [`Store::reconcile`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReconcileOptions {
    /// Only check and report what would be freed; change nothing.
    pub dry_run: bool,
    /// Most extents freed per commit (at least 1; also capped so that a
    /// batch fits in one journal entry).
    pub batch_extents: usize,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions {
            dry_run: false,
            batch_extents: 4096,
        }
    }
}

/// What [`Store::reconcile`] did or, in a dry run, would do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// True when nothing was changed on purpose.
    pub dry_run: bool,
    /// Live extents checked.
    pub live_extents: u64,
    /// Blocks in the live extents.
    pub live_blocks: u64,
    /// Allocated extents that no live extent covers: freed, or to be freed
    /// in a dry run. Each is a maximal allocated run between live extents
    /// and free space.
    pub freed_extents: u64,
    /// Blocks in those extents.
    pub freed_blocks: u64,
    /// Commits written (0 in a dry run).
    pub commits: u64,
}

impl Store {
    /// Frees every committed allocation not covered by the live extents
    /// `live()` streams, or in a dry run reports what it would free. See
    /// the [module documentation](crate::reconcile) for the protocol that
    /// makes this safe.
    ///
    /// `live` is called once for a dry run or when the check finds nothing
    /// to free, else twice (checking, then freeing); both streams must
    /// yield the same extents, sorted by start and disjoint. Time is
    /// `O((L + F) log F)` for `L` live and `F` free extents; memory is one
    /// batch.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use blockalloc_store::{device::MemDevice, FormatOptions, ReconcileOptions, Store};
    ///
    /// let store = Store::format(MemDevice::new(64 << 20), FormatOptions::default())?;
    /// let mut txn = store.begin();
    /// let kept = txn.allocate(8, None)?;
    /// let orphan = txn.allocate(8, None)?; // the index never learnt of it
    /// txn.commit()?;
    ///
    /// let index = [kept];
    /// let r = store.reconcile(
    ///     || index.iter().map(|&e| Ok::<_, Infallible>(e)),
    ///     ReconcileOptions::default(),
    /// )?;
    /// assert_eq!((r.freed_extents, r.freed_blocks), (1, 8));
    /// store.check_allocated(kept)?;
    /// assert!(store.check_allocated(orphan).is_err());
    /// # Ok::<(), blockalloc_store::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// [`StoreError::Reconcile`] as described on [`ReconcileError`] (from
    /// the checking pass: nothing changed); [`StoreError::ReadOnly`] unless
    /// a dry run; [`StoreError::Poisoned`], and
    /// commit errors (I/O, journal full) from the freeing pass, which keep
    /// the batches committed before.
    pub fn reconcile<F, I, E>(&self, mut live: F, opts: ReconcileOptions) -> Result<ReconcileReport>
    where
        F: FnMut() -> I,
        I: IntoIterator<Item = std::result::Result<Extent, E>>,
        E: Into<Box<dyn StdError + Send + Sync>>,
    {
        if !opts.dry_run {
            self.check_writable("reconcile")?;
        }
        self.check_poison()?;
        let commits = {
            let s = lock(&self.state);
            if s.open_txns > 0 {
                return Err(ReconcileError::Busy {
                    open_txns: s.open_txns,
                }
                .into());
            }
            // With no transaction open, every finished commit has been
            // counted (a transaction closes after its commit is counted).
            self.counters
                .commits
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let mut check = Walk::new(self, commits, None);
        check.run(live())?;
        let checked = check.report;
        if opts.dry_run || checked.freed_extents == 0 {
            return Ok(ReconcileReport {
                dry_run: opts.dry_run,
                ..checked
            });
        }
        let fit = self.max_entry_payload();
        let cap = opts.batch_extents.clamp(1, fit / MAX_FREE_OP_BYTES);
        let mut free = Walk::new(self, commits, Some(cap));
        match free.run(live()) {
            Ok(()) => {}
            Err(StoreError::Reconcile(e)) if e.is_bad_input() || is_mismatch(&e) => {
                return Err(free.changed(e.to_string()));
            }
            Err(e) => return Err(e),
        }
        let done = free.report;
        if (done.live_extents, done.live_blocks) != (checked.live_extents, checked.live_blocks) {
            return Err(free.changed(format!(
                "{} live extents of {} blocks, then {} of {}",
                checked.live_extents, checked.live_blocks, done.live_extents, done.live_blocks
            )));
        }
        Ok(done)
    }
}

fn is_mismatch(e: &ReconcileError) -> bool {
    matches!(e, ReconcileError::NotAllocated { .. })
}

/// One pass over the live extents, merged with the committed free list.
///
/// Invariant: every block in `[meta_blocks, cursor)` is covered by a live
/// extent, free, or (freeing pass) freed or queued in `batch`.
struct Walk<'s> {
    store: &'s Store,
    /// Next block not yet looked at.
    cursor: u64,
    previous: Option<Extent>,
    /// The commit count that proves nobody else used the store.
    commits: u64,
    /// Freeing pass: frees not yet committed, and the most per commit.
    batch: Option<(Vec<Extent>, usize)>,
    report: ReconcileReport,
    /// Freeing pass: what has been committed.
    committed: (u64, u64),
}

impl<'s> Walk<'s> {
    fn new(store: &'s Store, commits: u64, batch: Option<usize>) -> Self {
        Walk {
            store,
            cursor: store.sb.layout.meta_blocks,
            previous: None,
            commits,
            batch: batch.map(|cap| (Vec::with_capacity(cap), cap)),
            report: ReconcileReport {
                dry_run: batch.is_none(),
                ..ReconcileReport::default()
            },
            committed: (0, 0),
        }
    }

    fn changed(&self, reason: String) -> StoreError {
        ReconcileError::Changed {
            reason,
            freed_extents: self.committed.0,
            freed_blocks: self.committed.1,
        }
        .into()
    }

    fn run<I, E>(&mut self, live: I) -> Result<()>
    where
        I: IntoIterator<Item = std::result::Result<Extent, E>>,
        E: Into<Box<dyn StdError + Send + Sync>>,
    {
        for (i, item) in live.into_iter().enumerate() {
            let index = i as u64 + 1;
            let extent = item.map_err(|e| ReconcileError::Source {
                index,
                source: e.into(),
            })?;
            self.live(index, extent)?;
        }
        self.sweep(self.store.sb.layout.capacity_blocks)?;
        self.flush()
    }

    /// Takes the next live extent: validates it, frees what lies between
    /// the previous one and it.
    fn live(&mut self, index: u64, extent: Extent) -> Result<()> {
        let l = &self.store.sb.layout;
        if let Some(previous) = self.previous {
            if extent.start() < previous.start() {
                return Err(ReconcileError::OutOfOrder {
                    index,
                    extent,
                    previous,
                }
                .into());
            }
            if extent.start() < previous.end() {
                return Err(ReconcileError::Overlap {
                    index,
                    extent,
                    previous,
                }
                .into());
            }
        }
        if extent.start() < l.meta_blocks {
            return Err(ReconcileError::Metadata {
                index,
                extent,
                meta_blocks: l.meta_blocks,
            }
            .into());
        }
        if extent.end() > l.capacity_blocks {
            return Err(ReconcileError::OutOfRange {
                index,
                extent,
                capacity: l.capacity_blocks,
            }
            .into());
        }
        self.sweep(extent.start())?;
        let s = lock(&self.store.state);
        self.exclusive(&s)?;
        // Nothing else is open, so the engine's allocated space is the
        // committed allocated space.
        match s.engine.check_allocated(extent) {
            Ok(()) => {}
            Err(FreeError::NotAllocated { overlap, .. }) => {
                return Err(ReconcileError::NotAllocated {
                    index,
                    extent,
                    free: overlap,
                }
                .into())
            }
            Err(e) => return Err(e.into()),
        }
        drop(s);
        self.cursor = extent.end();
        self.previous = Some(extent);
        self.report.live_extents += 1;
        self.report.live_blocks += extent.len();
        Ok(())
    }

    /// Frees (or counts) the allocated runs in `[cursor, to)`, walking the
    /// free extents there one lookup each.
    fn sweep(&mut self, to: u64) -> Result<()> {
        while self.cursor < to {
            {
                let s = lock(&self.store.state);
                self.exclusive(&s)?;
                let mut steps = 0;
                while self.cursor < to && !self.batch_full() && steps < LOOKUPS_PER_LOCK {
                    steps += 1;
                    let gap = Extent::from_range(self.cursor, to).expect("cursor < to");
                    match s.engine.check_allocated(gap) {
                        Ok(()) => {
                            self.orphan(gap);
                            self.cursor = to;
                        }
                        Err(FreeError::NotAllocated { overlap, .. }) => {
                            if overlap.start() > self.cursor {
                                self.orphan(
                                    Extent::from_range(self.cursor, overlap.start())
                                        .expect("checked just above"),
                                );
                            }
                            self.cursor = overlap.end();
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            if self.batch_full() {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn batch_full(&self) -> bool {
        self.batch.as_ref().is_some_and(|(b, cap)| b.len() >= *cap)
    }

    /// An allocated run that no live extent covers.
    fn orphan(&mut self, e: Extent) {
        self.report.freed_extents += 1;
        self.report.freed_blocks += e.len();
        if let Some((b, _)) = &mut self.batch {
            b.push(e);
        }
    }

    /// Commits the queued frees as one transaction.
    fn flush(&mut self) -> Result<()> {
        let Some((batch, _)) = &mut self.batch else {
            return Ok(());
        };
        if batch.is_empty() {
            return Ok(());
        }
        let frees = std::mem::take(batch);
        {
            let mut s = lock(&self.store.state);
            self.exclusive(&s)?;
            // Marked like a transaction's frees: nobody else may free these
            // blocks until the commit is applied (or rolled back).
            for &e in &frees {
                s.pending_free.insert(e);
            }
            s.open_txns += 1;
        }
        let mut payload = Vec::with_capacity(frees.len() * MAX_FREE_OP_BYTES);
        for &e in &frees {
            JournalOp::Free(e).encode(&mut payload);
        }
        let (n, blocks) = (
            frees.len() as u64,
            frees.iter().map(|e| e.len()).sum::<u64>(),
        );
        let r = self.store.submit(crate::writer::Work {
            payload,
            frees,
            ..Default::default()
        });
        lock(&self.store.state).open_txns -= 1;
        r?;
        self.commits += 1;
        self.committed.0 += n;
        self.committed.1 += blocks;
        self.report.commits += 1;
        Ok(())
    }

    /// `Ok` while nobody else has used the store since the run started.
    fn exclusive(&self, s: &AllocState) -> Result<()> {
        let now = self
            .store
            .counters
            .commits
            .load(std::sync::atomic::Ordering::Relaxed);
        if s.open_txns > 0 || now != self.commits {
            return Err(ReconcileError::Interrupted {
                freed_extents: self.committed.0,
                freed_blocks: self.committed.1,
            }
            .into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;
    use crate::device::MemDevice;
    use crate::FormatOptions;

    fn store() -> Store {
        Store::format(MemDevice::new(16 << 20), FormatOptions::default()).unwrap()
    }

    fn ok(v: &[Extent]) -> impl FnMut() -> Vec<std::result::Result<Extent, Infallible>> + '_ {
        move || v.iter().map(|&e| Ok(e)).collect()
    }

    /// Allocates and commits `lens`, one extent each.
    fn commit_allocs(s: &Store, lens: &[u64]) -> Vec<Extent> {
        let mut t = s.begin();
        let v = lens.iter().map(|&l| t.allocate(l, None).unwrap()).collect();
        t.commit().unwrap();
        v
    }

    fn reconcile_err(r: Result<ReconcileReport>) -> ReconcileError {
        match r {
            Err(StoreError::Reconcile(e)) => e,
            other => panic!("expected a reconcile error, got {other:?}"),
        }
    }

    #[test]
    fn frees_exactly_what_no_live_extent_covers() {
        let s = store();
        let v = commit_allocs(&s, &[4, 5, 6, 7, 8]);
        let live = [v[1], v[3]];
        let before = s.committed_free_extents();
        let dry = s
            .reconcile(
                ok(&live),
                ReconcileOptions {
                    dry_run: true,
                    ..ReconcileOptions::default()
                },
            )
            .unwrap();
        assert_eq!(
            s.committed_free_extents(),
            before,
            "a dry run changes nothing"
        );
        assert!(dry.dry_run);
        assert_eq!((dry.live_extents, dry.live_blocks), (2, 12));
        assert_eq!(
            (dry.freed_extents, dry.freed_blocks, dry.commits),
            (3, 18, 0)
        );
        let done = s.reconcile(ok(&live), ReconcileOptions::default()).unwrap();
        assert_eq!(
            done,
            ReconcileReport {
                dry_run: false,
                commits: 1,
                ..dry
            }
        );
        for e in live {
            s.check_allocated(e).unwrap();
        }
        for e in [v[0], v[2], v[4]] {
            assert!(s.check_allocated(e).is_err(), "{e} was freed");
        }
        assert_eq!(s.status().space.used_blocks, s.layout().meta_blocks + 12);
        s.verify().unwrap();
        // Idempotent: a second run finds nothing.
        let again = s.reconcile(ok(&live), ReconcileOptions::default()).unwrap();
        assert_eq!((again.freed_extents, again.commits), (0, 0));
    }

    #[test]
    fn part_of_an_allocation_can_stay_live() {
        let s = store();
        let v = commit_allocs(&s, &[10]);
        let keep = Extent::new(v[0].start() + 3, 4).unwrap();
        let r = s
            .reconcile(ok(&[keep]), ReconcileOptions::default())
            .unwrap();
        assert_eq!((r.freed_extents, r.freed_blocks), (2, 6));
        s.check_allocated(keep).unwrap();
        assert_eq!(s.status().space.used_blocks, s.layout().meta_blocks + 4);
    }

    #[test]
    fn small_batches_commit_separately() {
        let s = store();
        let v = commit_allocs(&s, &[1; 20]);
        let live: Vec<Extent> = v.iter().copied().step_by(2).collect();
        let r = s
            .reconcile(
                ok(&live),
                ReconcileOptions {
                    batch_extents: 3,
                    ..ReconcileOptions::default()
                },
            )
            .unwrap();
        assert_eq!(r.freed_extents, 10);
        assert_eq!(r.commits, 4);
        assert_eq!(s.stats().commits, 1 + 4);
        s.verify().unwrap();
    }

    #[test]
    fn an_index_naming_free_space_changes_nothing() {
        let s = store();
        let v = commit_allocs(&s, &[4, 4, 4]);
        let mut t = s.begin();
        t.free(v[1]).unwrap();
        t.commit().unwrap();
        let before = s.committed_free_extents();
        let e = reconcile_err(s.reconcile(ok(&v), ReconcileOptions::default()));
        assert!(
            matches!(e, ReconcileError::NotAllocated { index: 2, free, .. } if free == v[1]),
            "{e}"
        );
        assert!(e.to_string().contains("is not allocated"), "{e}");
        assert_eq!(s.committed_free_extents(), before);
    }

    /// What a refused case must be.
    type Expect = fn(&ReconcileError) -> bool;

    #[test]
    fn malformed_live_lists_are_refused_before_any_change() {
        let s = store();
        let v = commit_allocs(&s, &[4, 4, 4]);
        let meta = s.layout().meta_blocks;
        let cap = s.layout().capacity_blocks;
        let before = s.committed_free_extents();
        let cases: Vec<(Vec<Extent>, Expect)> = vec![
            (vec![v[1], v[0]], |e| {
                matches!(e, ReconcileError::OutOfOrder { index: 2, .. })
            }),
            (vec![v[0], Extent::new(v[0].start() + 1, 2).unwrap()], |e| {
                matches!(e, ReconcileError::Overlap { index: 2, .. })
            }),
            (vec![v[0], v[0]], |e| {
                matches!(e, ReconcileError::Overlap { index: 2, .. })
            }),
            (vec![Extent::new(meta - 1, 2).unwrap()], |e| {
                matches!(e, ReconcileError::Metadata { index: 1, .. })
            }),
            (vec![v[0], Extent::new(cap - 1, 2).unwrap()], |e| {
                matches!(e, ReconcileError::OutOfRange { index: 2, .. })
            }),
        ];
        for (live, expect) in cases {
            let e = reconcile_err(s.reconcile(ok(&live), ReconcileOptions::default()));
            assert!(expect(&e), "{live:?}: {e}");
            assert!(e.is_bad_input());
            assert_eq!(s.committed_free_extents(), before, "{live:?}");
        }
        // The stream's own error, with its position.
        let e = reconcile_err(s.reconcile(
            || vec![Ok(v[0]), Err("line 2: not a number")],
            ReconcileOptions::default(),
        ));
        assert!(matches!(e, ReconcileError::Source { index: 2, .. }), "{e}");
        assert!(e.to_string().contains("not a number"), "{e}");
        assert_eq!(s.committed_free_extents(), before);
    }

    #[test]
    fn a_read_only_store_reconciles_only_in_a_dry_run() {
        let dev = std::sync::Arc::new(MemDevice::new(16 << 20));
        let v = {
            let s = Store::format(dev.clone(), FormatOptions::default()).unwrap();
            commit_allocs(&s, &[4, 4])
        };
        let (s, _) = Store::open_read_only(MemDevice::from_image(dev.image())).unwrap();
        let dry = ReconcileOptions {
            dry_run: true,
            ..ReconcileOptions::default()
        };
        let r = s.reconcile(ok(&v[..1]), dry).unwrap();
        assert_eq!((r.freed_extents, r.freed_blocks), (1, 4));
        let e = s
            .reconcile(ok(&v[..1]), ReconcileOptions::default())
            .unwrap_err();
        assert!(matches!(e, StoreError::ReadOnly { .. }), "{e}");
        s.check_allocated(v[1]).unwrap();
    }

    #[test]
    fn open_transactions_make_reconcile_busy() {
        let s = store();
        let v = commit_allocs(&s, &[4]);
        let t = s.begin();
        let e = reconcile_err(s.reconcile(ok(&[]), ReconcileOptions::default()));
        assert!(matches!(e, ReconcileError::Busy { open_txns: 1 }), "{e}");
        t.abort();
        s.check_allocated(v[0]).unwrap();
        s.reconcile(ok(&[]), ReconcileOptions::default()).unwrap();
        assert!(s.check_allocated(v[0]).is_err());
    }

    #[test]
    fn a_transaction_during_reconcile_interrupts_it() {
        let s = store();
        let v = commit_allocs(&s, &[4, 4, 4]);
        let mut calls = 0;
        let mut sneaked = None;
        // The second (freeing) stream commits an allocation of its own
        // before yielding: reconcile must stop instead of freeing it.
        let e = reconcile_err(s.reconcile(
            || {
                calls += 1;
                if calls == 2 {
                    let mut t = s.begin();
                    sneaked = Some(t.allocate(2, None).unwrap());
                    t.commit().unwrap();
                }
                vec![Ok::<_, Infallible>(v[1])]
            },
            ReconcileOptions::default(),
        ));
        assert!(
            matches!(
                e,
                ReconcileError::Interrupted {
                    freed_extents: 0,
                    ..
                }
            ),
            "{e}"
        );
        s.check_allocated(sneaked.unwrap()).unwrap();
        s.check_allocated(v[0]).unwrap();
        s.verify().unwrap();
    }

    #[test]
    fn a_stream_that_changes_between_passes_is_caught() {
        let s = store();
        let v = commit_allocs(&s, &[4, 4, 4]);
        let mut calls = 0;
        let e = reconcile_err(s.reconcile(
            || {
                calls += 1;
                let live = if calls == 1 {
                    vec![v[1]]
                } else {
                    vec![v[1], v[2]]
                };
                live.into_iter()
                    .map(Ok::<_, Infallible>)
                    .collect::<Vec<_>>()
            },
            ReconcileOptions::default(),
        ));
        assert!(matches!(e, ReconcileError::Changed { .. }), "{e}");
        s.verify().unwrap();
    }
}
