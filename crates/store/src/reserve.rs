//! [`Reservation`]: free space set aside in memory, published piece by piece
//! as durable allocations or cancelled; the type documents the scheme and
//! its invariants.

use std::sync::Arc;

use blockalloc::{Allocator, Extent};

use crate::error::{Result, StoreError};
use crate::ranges::RangeSet;
use crate::store::{lock, AllocState, Store};
use crate::txn::{check_free, CommitInfo, Txn};

/// Free space held in memory for one owner (e.g. a client's lease), never
/// journaled.
///
/// as durable allocations (the reserve → publish / cancel scheme of DAOS
/// VEA, see `docs/background.md`).
///
/// * [`Store::reserve`] takes a contiguous extent from the engine and
///   records it in the same `reserved` set as the allocations of open
///   transactions. Nothing is journaled: a checkpoint counts reserved blocks
///   as free, and after a crash the reservation is simply gone — its blocks
///   are free again, nothing leaks.
/// * [`Reservation::publish`] makes sub-extents of the reservation durable
///   allocations, together with a batch of frees, in one journal record
///   shared with concurrent commits (group commit). A published piece may
///   span adjacent members (space taken in later, e.g. with
///   [`Reservation::take_range`] or [`Reservation::merge`], may touch what
///   was there): the members it touches are cut around it, the piece
///   leaves the reservation, the parts left and right of it stay.
/// * [`Reservation::cancel`], or dropping the reservation, returns the
///   unpublished rest to free space at once (it was never durable, so it
///   can be reused at once).
///
/// Invariants (under the store's `state` lock):
/// * every member of a reservation's `held` set is a member of the store's
///   `reserved` set, and allocated in the engine;
/// * `held.blocks()` == blocks reserved − blocks published − blocks
///   lost to a failed publish.
///
/// ```
/// use std::sync::Arc;
/// use blockalloc::Extent;
/// use blockalloc_store::{device::MemDevice, FormatOptions, Store};
///
/// let store = Arc::new(Store::format(MemDevice::new(64 << 20), FormatOptions::default())?);
/// let mut r = store.reserve(1024, None)?;
/// let whole = r.extents()[0];
/// // The owner writes its data into part of the region, then publishes it.
/// let obj = Extent::new(whole.start(), 16)?;
/// r.publish(&[obj], &[])?; // durable now
/// assert_eq!(r.blocks(), 1024 - 16);
/// r.cancel(); // the rest is free again
/// store.check_allocated(obj)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[must_use = "a reservation is cancelled when dropped"]
pub struct Reservation {
    store: Arc<Store>,
    /// The unpublished members.
    held: RangeSet,
}

impl Store {
    /// Reserves `len` contiguous free blocks, near `hint` if possible,
    /// in memory only.
    ///
    /// # Errors
    /// [`StoreError::Alloc`] (no space, zero length, bad hint),
    /// [`StoreError::Poisoned`].
    pub fn reserve(self: &Arc<Self>, len: u64, hint: Option<u64>) -> Result<Reservation> {
        self.check_poison()?;
        let mut s = lock(&self.state);
        let e = s.engine.allocate(len, hint)?;
        s.reserved.insert(e);
        drop(AllocState::took(s, self, &[e]));
        let mut held = RangeSet::new(self.sb.layout.capacity_blocks);
        held.insert(e);
        Ok(Reservation {
            store: Arc::clone(self),
            held,
        })
    }

    /// An empty reservation, to [take](Reservation::take_range) or
    /// [merge](Reservation::merge) space into later.
    pub fn empty_reservation(self: &Arc<Self>) -> Reservation {
        Reservation {
            store: Arc::clone(self),
            held: RangeSet::new(self.sb.layout.capacity_blocks),
        }
    }

    /// Reserves every free block inside `range` (none is fine: the
    /// reservation is then empty and can [take](Reservation::take_range)
    /// more later). A space owner that must allocate only inside its own
    /// part of the device (a tenant's regions) holds that part's free space
    /// this way and hands it out with [`Reservation::split_off`] and
    /// [`Reservation::publish`].
    ///
    /// # Errors
    /// [`StoreError::Free`] (out of range) when `range` reaches past the
    /// device, [`StoreError::Poisoned`].
    pub fn reserve_range(self: &Arc<Self>, range: Extent) -> Result<Reservation> {
        let mut r = self.empty_reservation();
        r.take_range(range)?;
        Ok(r)
    }
}

impl Reservation {
    /// The unpublished extents, in address order.
    pub fn extents(&self) -> Vec<Extent> {
        self.held.iter().collect()
    }

    /// Unpublished blocks.
    pub fn blocks(&self) -> u64 {
        self.held.blocks()
    }

    /// True when every block has been published.
    pub fn is_empty(&self) -> bool {
        self.held.blocks() == 0
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Adds every free block of the store inside `range` to this
    /// reservation; returns the extents taken, in address order.
    ///
    /// # Errors
    /// [`StoreError::Free`] (out of range) when `range` reaches past the
    /// device (nothing is taken), [`StoreError::Poisoned`].
    pub fn take_range(&mut self, range: Extent) -> Result<Vec<Extent>> {
        self.store.check_poison()?;
        let cap = self.store.sb.layout.capacity_blocks;
        if range.end() > cap {
            return Err(StoreError::Free(blockalloc::FreeError::OutOfRange {
                extent: range,
                capacity: cap,
            }));
        }
        let mut s = lock(&self.store.state);
        let taken = s.engine.take_free_range(range);
        for &e in &taken {
            s.reserved.insert(e);
            self.held.insert(e);
        }
        drop(AllocState::took(s, &self.store, &taken));
        Ok(taken)
    }

    /// Returns the unpublished blocks inside `range` to free space; returns
    /// how many. Members reaching out of `range` are cut: their parts
    /// outside stay reserved.
    pub fn release_range(&mut self, range: Extent) -> u64 {
        let inside = self.held.remove_inside(range);
        if inside.is_empty() {
            return 0;
        }
        let mut s = lock(&self.store.state);
        for &piece in &inside {
            s.reserved.cut(piece);
            s.engine
                .free(piece)
                .expect("a reserved extent is allocated in the engine");
        }
        inside.iter().map(|e| e.len()).sum()
    }

    /// Moves `e` (unpublished blocks, possibly spanning adjacent members)
    /// into a reservation of its own, as one member, e.g. to lease part of a
    /// larger reservation to someone else or to publish it apart. Nothing is
    /// journaled and nothing leaves the reserved state.
    ///
    /// # Errors
    /// [`StoreError::NotReserved`] when part of `e` is not unpublished in
    /// this reservation (nothing changes).
    pub fn split_off(&mut self, e: Extent) -> Result<Reservation> {
        if !self.held.remove(e) {
            return Err(StoreError::NotReserved { extent: e });
        }
        // The blocks stay reserved, now for the new reservation.
        let mut held = RangeSet::new(self.store.sb.layout.capacity_blocks);
        held.insert(e);
        Ok(Reservation {
            store: Arc::clone(&self.store),
            held,
        })
    }

    /// Takes over every unpublished member of `other` (of the same store),
    /// e.g. the unused rest of a lease coming back to its owner's
    /// reservation.
    ///
    /// # Errors
    /// [`StoreError::NotReserved`] when `other` belongs to another store
    /// (`other` is then cancelled: its blocks are free again).
    pub fn merge(&mut self, mut other: Reservation) -> Result<()> {
        if !Arc::ptr_eq(&self.store, &other.store) {
            let first = other.held.iter().next();
            other.release_all();
            return match first {
                Some(extent) => Err(StoreError::NotReserved { extent }),
                None => Ok(()),
            };
        }
        // `other` is left empty: dropping it releases nothing.
        for m in std::mem::replace(&mut other.held, RangeSet::new(0)).iter() {
            self.held.insert(m);
        }
        Ok(())
    }

    /// Publishes `allocs` (each inside the unpublished part, pairwise
    /// disjoint) as durable allocations and frees `frees` (committed
    /// allocations of the store, as [`crate::Txn::free`] takes them), in one
    /// journal record; returns once it is durable.
    ///
    /// Validation comes first and changes nothing when it fails. When the
    /// journal write fails ([`StoreError::TxnTooLarge`],
    /// [`StoreError::JournalFull`], I/O), the published pieces have already
    /// left the reservation and are free again, and nothing is freed.
    ///
    /// # Errors
    /// [`StoreError::NotReserved`] for an allocation outside the unpublished
    /// part (or overlapping another allocation of the batch); the errors of
    /// [`crate::Txn::free`] for a free; the errors of [`crate::Txn::commit`].
    pub fn publish(&mut self, allocs: &[Extent], frees: &[Extent]) -> Result<CommitInfo> {
        let store = Arc::clone(&self.store);
        let mut txn = store.begin();
        self.publish_in(&mut txn, allocs, frees)?;
        txn.commit()
    }

    /// As [`Self::publish`], but the record joins `txn` (a transaction of
    /// the same store) instead of being committed here: it becomes durable
    /// with `txn`, and when `txn` is aborted or fails the published pieces
    /// are free again, as when a publish fails. With
    /// [`Store::commit_all`], one thread publishes in many reservations
    /// with one journal write.
    ///
    /// # Errors
    /// Those of [`Self::publish`]'s validation (nothing changed);
    /// [`StoreError::NotReserved`] when `txn` is another store's.
    pub fn publish_in(
        &mut self,
        txn: &mut Txn<'_>,
        allocs: &[Extent],
        frees: &[Extent],
    ) -> Result<()> {
        self.store.check_poison()?;
        if !std::ptr::eq(txn.store, Arc::as_ptr(&self.store)) {
            if let Some(&extent) = allocs.first().or(frees.first()) {
                return Err(StoreError::NotReserved { extent });
            }
        }
        if allocs.is_empty() && frees.is_empty() {
            return Ok(());
        }
        let store = Arc::clone(&self.store);
        let layout = store.sb.layout;
        let mut s = lock(&store.state);
        // Each piece leaves the unpublished part as it is checked (a piece
        // overlapping an earlier one of the batch is no longer there); a
        // refusal puts back what was taken, so nothing changes. A published
        // piece stays in the store's `reserved` set: the commit machinery
        // removes it once durable, or frees it in the engine when the
        // record was not written.
        for (i, &a) in allocs.iter().enumerate() {
            if !self.held.remove(a) {
                self.undo(&mut s, &allocs[..i], &[]);
                return Err(StoreError::NotReserved { extent: a });
            }
        }
        for (i, &f) in frees.iter().enumerate() {
            if let Err(e) = check_free(&s, &layout, f) {
                self.undo(&mut s, allocs, &frees[..i]);
                return Err(e);
            }
            // A later free of the batch that overlaps this one is refused
            // as a pending free.
            s.pending_free.insert(f);
        }
        drop(s);
        txn.allocs.extend_from_slice(allocs);
        txn.frees.extend_from_slice(frees);
        Ok(())
    }

    /// Undoes a refused publish's first steps: `allocs` back into the
    /// unpublished part, `frees` out of the pending frees.
    fn undo(&mut self, s: &mut AllocState, allocs: &[Extent], frees: &[Extent]) {
        for &a in allocs {
            self.held.insert(a);
        }
        for &f in frees {
            s.pending_free.cut(f);
        }
    }

    /// Returns the unpublished rest to free space; returns its size in
    /// blocks.
    pub fn cancel(mut self) -> u64 {
        self.release_all()
    }

    fn release_all(&mut self) -> u64 {
        let n = self.held.blocks();
        if n == 0 {
            return 0;
        }
        let mut s = lock(&self.store.state);
        for m in self.held.iter() {
            s.reserved.cut(m);
            s.engine
                .free(m)
                .expect("a reserved extent is allocated in the engine");
        }
        drop(s);
        self.held = RangeSet::new(0);
        n
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.release_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;
    use crate::FormatOptions;

    fn x(s: u64, l: u64) -> Extent {
        Extent::new(s, l).unwrap()
    }

    fn fresh(dev: &Arc<MemDevice>) -> Arc<Store> {
        Arc::new(Store::format(dev.clone(), FormatOptions::default()).unwrap())
    }

    #[test]
    fn reserved_space_is_neither_free_nor_committed() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let store = fresh(&dev);
        let free0 = store.status().space.free_blocks;
        let r = store.reserve(1000, None).unwrap();
        let e = r.extents()[0];
        assert_eq!(store.status().space.free_blocks, free0 - 1000);
        assert_eq!(store.status().reserved_blocks, 1000);
        // A checkpoint counts it free; a free of it is refused.
        assert!(store
            .committed_free_extents()
            .iter()
            .any(|f| f.contains(&e)));
        assert!(store.begin().free(e).is_err());
        store.verify().unwrap();
        assert_eq!(r.cancel(), 1000);
        assert_eq!(store.status().space.free_blocks, free0);
        store.verify().unwrap();
    }

    #[test]
    fn the_cheap_free_count_matches_status_through_reserve_publish_and_free() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let store = fresh(&dev);
        let same = |store: &Store| {
            assert_eq!(store.free_blocks(), store.status().space.free_blocks);
        };
        same(&store);
        let mut r = store.reserve(100, None).unwrap();
        same(&store);
        let piece = x(r.extents()[0].start(), 10);
        r.publish(&[piece], &[]).unwrap();
        same(&store);
        let mut txn = store.begin();
        txn.free(piece).unwrap();
        same(&store);
        txn.commit().unwrap();
        same(&store);
        assert_eq!(r.take_range(piece).unwrap(), vec![piece]);
        same(&store);
        r.cancel();
        same(&store);
        assert_eq!(
            store.free_blocks(),
            store.geometry().capacity_blocks() - store.layout().meta_blocks
        );
    }

    #[test]
    fn a_publish_may_span_members_taken_in_at_different_times() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let store = fresh(&dev);
        let mut r = store.reserve(100, None).unwrap();
        let base = r.extents()[0].start();
        let mid = x(base + 40, 20);
        r.publish(&[mid], &[]).unwrap();
        let mut txn = store.begin();
        txn.free(mid).unwrap();
        txn.commit().unwrap();
        // Freed and taken back: it joins its neighbours again.
        assert_eq!(r.take_range(mid).unwrap(), vec![mid]);
        assert_eq!(r.extents(), vec![x(base, 100)]);
        let across = x(base + 30, 50);
        r.publish(&[across], &[]).unwrap();
        assert_eq!(r.extents(), vec![x(base, 30), x(base + 80, 20)]);
        store.check_allocated(across).unwrap();
        store.verify().unwrap();
        // A piece reaching past the reservation is still refused.
        let e = r.publish(&[x(base + 90, 20)], &[]).unwrap_err();
        assert!(matches!(e, StoreError::NotReserved { .. }), "{e}");
        assert_eq!(r.cancel(), 50);
        store.verify().unwrap();
    }

    #[test]
    fn publish_splits_the_reservation_and_survives_a_crash() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let store = fresh(&dev);
        let mut r = store.reserve(100, None).unwrap();
        let base = r.extents()[0].start();
        let mid = x(base + 10, 5);
        let head = x(base, 3);
        let info = r.publish(&[mid, head], &[]).unwrap();
        assert!(info.seq >= 1);
        assert_eq!(info.allocs, 2);
        assert_eq!(
            r.extents(),
            vec![x(base + 3, 7), x(base + 15, 85)],
            "the published pieces leave the reservation"
        );
        store.check_allocated(mid).unwrap();
        store.check_allocated(head).unwrap();
        store.verify().unwrap();
        // Publishing the same piece again is outside the unpublished part.
        let e = r.publish(&[mid], &[]).unwrap_err();
        assert!(matches!(e, StoreError::NotReserved { .. }), "{e}");
        // A later publish can free what an earlier one made durable.
        let tail = x(base + 99, 1);
        r.publish(&[tail], &[head]).unwrap();
        assert!(store.check_allocated(head).is_err());
        store.verify().unwrap();
        // The power goes: published survives, the unpublished rest is free.
        let image = dev.image();
        let (reopened, _) = Store::open(MemDevice::from_image(image)).unwrap();
        reopened.check_allocated(mid).unwrap();
        reopened.check_allocated(tail).unwrap();
        assert!(reopened.check_allocated(head).is_err());
        let free = reopened.committed_free_extents();
        for rest in r.extents() {
            assert!(
                free.iter().any(|f| f.contains(&rest)),
                "{rest} is free after the crash"
            );
        }
        let meta = reopened.layout().meta_blocks;
        assert_eq!(reopened.status().space.used_blocks, meta + 5 + 1);
        reopened.verify().unwrap();
        drop(r);
        store.verify().unwrap();
    }

    #[test]
    fn a_checkpoint_during_a_reservation_keeps_it_free_on_disk() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let store = fresh(&dev);
        let r = store.reserve(64, None).unwrap();
        let e = r.extents()[0];
        store.checkpoint().unwrap();
        let (reopened, _) = Store::open(MemDevice::from_image(dev.image())).unwrap();
        assert!(reopened.check_allocated(e).is_err());
        assert_eq!(
            reopened.status().space.used_blocks,
            reopened.layout().meta_blocks
        );
        drop(r);
    }

    #[test]
    fn a_range_reservation_holds_only_free_blocks_of_its_range() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let store = fresh(&dev);
        let meta = store.layout().meta_blocks;
        let free0 = store.status().space.free_blocks;
        let mut txn = store.begin();
        let busy = txn.allocate(10, Some(meta + 100)).unwrap();
        txn.commit().unwrap();
        let range = x(meta, 1000);
        let mut r = store.reserve_range(range).unwrap();
        assert_eq!(r.blocks(), 990);
        assert!(r
            .extents()
            .iter()
            .all(|e| range.contains(e) && !e.overlaps(&busy)));
        assert_eq!(store.status().space.free_blocks, free0 - 1000);
        // Nothing else can get it; a split-off piece publishes by itself.
        let piece = x(meta + 500, 20);
        let mut lease = r.split_off(piece).unwrap();
        assert_eq!(r.blocks(), 970);
        assert!(r.split_off(piece).is_err(), "already split off");
        lease.publish(&[x(meta + 500, 5)], &[busy]).unwrap();
        store.verify().unwrap();
        // The freed extent comes back into the range reservation on demand.
        assert_eq!(r.take_range(busy).unwrap(), vec![busy]);
        assert_eq!(r.blocks(), 980);
        r.merge(lease).unwrap();
        assert_eq!(r.blocks(), 995);
        // A piece spanning adjacent members (the lease's rest and the pool)
        // splits off as one member and publishes as one extent.
        let across = x(meta + 505, 25);
        let mut one = r.split_off(across).unwrap();
        assert_eq!(one.extents(), vec![across]);
        r.merge(one.split_off(across).unwrap()).unwrap();
        assert!(one.is_empty());
        assert!(r.split_off(x(meta + 502, 2)).is_err(), "published");
        // Releasing a middle part cuts members; the rest stays reserved.
        assert_eq!(r.release_range(x(meta + 200, 100)), 100);
        assert_eq!(r.blocks(), 895);
        store.verify().unwrap();
        assert_eq!(store.status().reserved_blocks, 895);
        assert_eq!(r.cancel(), 895);
        assert_eq!(store.status().space.free_blocks, free0 - 5);
        store.verify().unwrap();
    }

    #[test]
    fn a_range_past_the_device_is_refused_and_changes_nothing() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let store = fresh(&dev);
        let cap = store.geometry().capacity_blocks();
        let free0 = store.status().space.free_blocks;
        let e = store.reserve_range(x(cap - 10, 20)).unwrap_err();
        assert!(matches!(e, StoreError::Free(_)), "{e}");
        assert_eq!(store.status().space.free_blocks, free0);
        let other =
            Arc::new(Store::format(MemDevice::new(64 << 20), FormatOptions::default()).unwrap());
        let mut mine = store.reserve_range(x(cap - 10, 10)).unwrap();
        let foreign = other.reserve(4, None).unwrap();
        assert!(mine.merge(foreign).is_err(), "another store's reservation");
        assert_eq!(other.status().reserved_blocks, 0);
        assert_eq!(mine.blocks(), 10);
    }

    #[test]
    fn bad_publishes_change_nothing() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let store = fresh(&dev);
        let mut r = store.reserve(50, None).unwrap();
        let other = store.reserve(50, None).unwrap();
        let base = r.extents()[0].start();
        let before = r.extents();
        let outside = other.extents()[0];
        for (allocs, frees) in [
            (vec![x(base + 40, 20)], vec![]),           // reaches past the end
            (vec![outside], vec![]),                    // another reservation
            (vec![x(base, 5), x(base + 2, 5)], vec![]), // overlapping batch
            (vec![x(base, 5)], vec![outside]),          // free of reserved space
            (vec![x(base, 5)], vec![x(0, 1)]),          // free of metadata
        ] {
            assert!(r.publish(&allocs, &frees).is_err(), "{allocs:?} {frees:?}");
            assert_eq!(r.extents(), before);
            store.verify().unwrap();
        }
        assert_eq!(store.status().pending_free_blocks, 0);
        assert_eq!(store.status().reserved_blocks, 100);
        let published = x(base + 1, 1);
        r.publish(&[published], &[]).unwrap();
        let e = r.publish(&[], &[published, published]).unwrap_err();
        assert!(matches!(e, StoreError::FreeConflict { .. }), "{e}");
        store.check_allocated(published).unwrap();
        drop(other);
        drop(r);
        store.verify().unwrap();
        assert_eq!(
            store.status().space.used_blocks,
            store.layout().meta_blocks + 1
        );
    }
}
