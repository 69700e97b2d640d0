//! [`SharedAllocator`]: the thread-safe handle.
//!
//! Layout: a pool arena (index 0) and up to `max_arenas` thread arenas, each
//! a [`SegFitAllocator`] behind its own mutex (see [`crate::arena`]), and the
//! region ownership table ([`crate::regions`]).
//!
//! * **allocate**: the calling thread's arena, under its own lock (nobody
//!   else takes it except to free into it or at the very end). If it has no
//!   room, lease a region from the pool (one locked step moves a whole
//!   region's free space: the batch refill) and retry. Then the pool itself,
//!   then every other arena. Only then **reclaim**: with every lock held,
//!   move all arenas' free space back into the pool, where it merges across
//!   region borders, and try once more. So an allocation fails only when the
//!   whole device, as one engine, has no room: cached space is never
//!   stranded.
//! * **free**: by address. The owner of the extent's region takes it, under
//!   its lock, whichever thread frees: double frees are detected exactly as
//!   in a single engine. Ownership is re-checked under the lock (a region may
//!   move between the lookup and the lock), and an extent spanning regions of
//!   different owners is checked in all of them before any is changed.
//! * **crowded**: when the pool has no region worth leasing, the device is
//!   nearly full. Every arena is reclaimed once and allocations go to the
//!   pool (one engine, one lock) until a whole region is free again, so the
//!   last stretch packs like a single engine; throughput there is that of
//!   one lock.
//! * **return** (the batch hand-back, with a high-water mark): a thread arena
//!   holding more than `keep_empty_regions` entirely free regions gives the
//!   extra ones back to the pool. A thread that exits (or calls
//!   [`SharedAllocator::flush`]) gives everything back.
//!
//! Lock order: the pool before any thread arena, thread arenas by index.
//! Code that holds an arena and needs the pool either releases its arena
//! first or only `try_lock`s the pool.

use std::cell::RefCell;

use blockalloc::{
    AllocError, Allocator, Extent, FreeError, SegFitAllocator, Status, StatusBuilder, VerifyError,
};
use crossbeam_utils::CachePadded;

use crate::arena::Arena;
use crate::config::{ConfigError, SharedConfig};
use crate::regions::{Regions, POOL};
use crate::sync::{
    lock, thread_local, Arc, AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering, Weak,
};

/// Distinguishes allocator instances in the thread-local bindings.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Leases tried for one allocation before falling back to the pool.
const LEASE_TRIES: usize = 4;

/// A thread-safe allocator over one device: `Send + Sync`, cheap to clone
/// (clones share the allocator).
///
/// ```
/// use blockalloc_shared::SharedAllocator;
/// use std::thread;
///
/// let a = SharedAllocator::new(1 << 20)?; // 4 GiB of 4 KiB blocks
/// let handles: Vec<_> = (0..4)
///     .map(|_| {
///         let a = a.clone();
///         thread::spawn(move || {
///             let e = a.allocate(256, None).unwrap();
///             a.free(e).unwrap();
///         })
///     })
///     .collect();
/// for h in handles {
///     h.join().unwrap();
/// }
/// assert_eq!(a.used(), 0);
/// a.verify()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct SharedAllocator {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    id: u64,
    capacity: u64,
    config: SharedConfig,
    regions: Regions,
    /// Index 0 is the pool.
    arenas: Box<[CachePadded<Mutex<Arena>>]>,
    /// Free blocks per arena, written under the arena's lock, read without.
    free: Box<[CachePadded<AtomicU64>]>,
    /// Threads bound to each arena.
    bound: Mutex<Vec<u32>>,
    locks: Box<[CachePadded<LockCounters>]>,
    counters: Counters,
    /// Set when the pool has no region worth leasing: the device is nearly
    /// full, and from then on allocations go to the pool, where all free
    /// space is one engine (packing like a single engine for the last
    /// stretch), until a region is entirely free again.
    crowded: CachePadded<AtomicBool>,
}

/// This thread's arena for each live allocator; handed back on exit.
struct Bindings(Vec<(u64, Weak<Inner>, u32)>);

impl Drop for Bindings {
    fn drop(&mut self) {
        for (_, inner, arena) in self.0.drain(..) {
            if let Some(inner) = inner.upgrade() {
                inner.unbind(arena);
            }
        }
    }
}

thread_local! {
    static BINDINGS: RefCell<Bindings> = const { RefCell::new(Bindings(Vec::new())) };
}

impl SharedAllocator {
    /// Engine name in reports.
    pub const NAME: &'static str = "segfit-shared";

    /// A fresh device of `capacity` blocks, all free, default configuration.
    ///
    /// # Errors
    /// [`ConfigError::Build`] for a zero capacity.
    pub fn new(capacity: u64) -> Result<Self, ConfigError> {
        Self::with_config(capacity, SharedConfig::for_capacity(capacity))
    }

    /// A fresh device with the given configuration.
    ///
    /// # Errors
    /// [`ConfigError`] for a zero capacity or a configuration that does not
    /// fit the device.
    pub fn with_config(capacity: u64, config: SharedConfig) -> Result<Self, ConfigError> {
        config.region_shift(capacity)?;
        let all = Extent::new(0, capacity).expect("capacity > 0");
        Self::from_free_extents(capacity, &[all], config)
    }

    /// A device of `capacity` blocks where exactly `free` (sorted, disjoint)
    /// is free: how a durable store restores a shared allocator.
    ///
    /// Memory: a 4-byte owner per region, and per arena an entry per region
    /// it holds (the pool holds every region with free space no thread has
    /// leased) plus its engine.
    ///
    /// # Errors
    /// [`ConfigError`] for a bad configuration, and
    /// [`ConfigError::Build`] as
    /// [`blockalloc::FromFreeExtents::from_free_extents`] for the device and
    /// the free list.
    pub fn from_free_extents(
        capacity: u64,
        free: &[Extent],
        config: SharedConfig,
    ) -> Result<Self, ConfigError> {
        let shift = config.region_shift(capacity)?;
        let regions = Regions::new(capacity, shift);
        let pool = Arena::pool(&regions, capacity, free)?;
        let n = config.max_arenas + 1;
        let mut arenas = Vec::with_capacity(n);
        let pool_free = pool.free_blocks();
        arenas.push(CachePadded::new(Mutex::new(pool)));
        for _ in 1..n {
            arenas.push(CachePadded::new(Mutex::new(Arena::empty(capacity)?)));
        }
        let free_counts: Box<[_]> = (0..n)
            .map(|i| CachePadded::new(AtomicU64::new(if i == 0 { pool_free } else { 0 })))
            .collect();
        Ok(SharedAllocator {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                capacity,
                config,
                regions,
                arenas: arenas.into_boxed_slice(),
                free: free_counts,
                bound: Mutex::new(vec![0; n]),
                locks: (0..n)
                    .map(|_| CachePadded::new(LockCounters::default()))
                    .collect(),
                counters: Counters::default(),
                crowded: CachePadded::new(AtomicBool::new(false)),
            }),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> SharedConfig {
        self.inner.config
    }

    /// Device size in blocks.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// Blocks allocated (free space cached in thread arenas counts as free).
    /// Read without locks: exact when no operation is in flight.
    pub fn used(&self) -> u64 {
        let free: u64 = self
            .inner
            .free
            .iter()
            .map(|f| f.load(Ordering::Relaxed))
            .sum();
        self.inner.capacity.saturating_sub(free)
    }

    /// Free blocks parked in thread arenas (counted as free in
    /// [`used`](Self::used) and [`status`](Self::status)).
    pub fn cached_blocks(&self) -> u64 {
        self.inner.free[1..]
            .iter()
            .map(|f| f.load(Ordering::Relaxed))
            .sum()
    }

    /// Allocates `len` contiguous blocks, near `hint` if possible.
    ///
    /// # Errors
    /// [`AllocError::ZeroLength`], [`AllocError::HintOutOfRange`], or
    /// [`AllocError::NoSpace`] when no free run of `len` blocks exists on the
    /// whole device (after every thread's cached space was reclaimed).
    pub fn allocate(&self, len: u64, hint: Option<u64>) -> Result<Extent, AllocError> {
        let inner = &*self.inner;
        if len == 0 {
            return Err(AllocError::ZeroLength);
        }
        if let Some(h) = hint.filter(|&h| h > inner.capacity) {
            return Err(AllocError::HintOutOfRange {
                hint: h,
                capacity: inner.capacity,
            });
        }
        let me = self.my_arena();
        if me != POOL && !inner.crowded.load(Ordering::Relaxed) {
            // The pool's free space, as the arena's reserve of long runs.
            let refill = inner.free[POOL as usize].load(Ordering::Relaxed);
            if let Some(e) = inner.try_arena(me, len, hint, refill)? {
                return Ok(e);
            }
            if len <= inner.regions.blocks_per_region() / 2 {
                for _ in 0..LEASE_TRIES {
                    if !inner.lease(me, len) {
                        break;
                    }
                    if let Some(e) = inner.try_arena(me, len, hint, refill)? {
                        return Ok(e);
                    }
                }
            }
            // No region to add: the arena's own fragments, by best fit.
            if refill >= SegFitAllocator::MIN_REFILL {
                if let Some(e) = inner.try_arena(me, len, hint, 0)? {
                    return Ok(e);
                }
            }
        }
        inner.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
        if let Some(e) = inner.try_arena(POOL, len, hint, 0)? {
            return Ok(e);
        }
        for a in 1..inner.arenas.len() as u32 {
            if a != me {
                if let Some(e) = inner.try_arena(a, len, hint, 0)? {
                    return Ok(e);
                }
            }
        }
        let mut all = inner.lock_all();
        inner.reclaim_locked(&mut all);
        let r = all[0].allocate(&inner.regions, len, hint);
        inner.publish(&all[0], POOL);
        r
    }

    /// Allocates `len` blocks in as few extents as the engine can, appended
    /// to `out`; all or nothing.
    ///
    /// # Errors
    /// As [`allocate`](Self::allocate); [`AllocError::NoSpace`] only when
    /// fewer than `len` blocks are free on the whole device.
    pub fn allocate_scattered(&self, len: u64, out: &mut Vec<Extent>) -> Result<(), AllocError> {
        match self.allocate(len, None) {
            Ok(e) => {
                out.push(e);
                Ok(())
            }
            Err(AllocError::NoSpace { .. }) => {
                let inner = &*self.inner;
                let mut all = inner.lock_all();
                inner.reclaim_locked(&mut all);
                let r = all[0].allocate_scattered(&inner.regions, len, out);
                inner.publish(&all[0], POOL);
                r
            }
            Err(e) => Err(e),
        }
    }

    /// Frees `extent`, from any thread.
    ///
    /// # Errors
    /// [`FreeError::OutOfRange`], or [`FreeError::NotAllocated`] when any of
    /// its blocks is free (a double free), wherever that free space is cached.
    pub fn free(&self, extent: Extent) -> Result<(), FreeError> {
        let inner = &*self.inner;
        if extent.end() > inner.capacity {
            return Err(FreeError::OutOfRange {
                extent,
                capacity: inner.capacity,
            });
        }
        loop {
            let owner = inner.regions.owner(inner.regions.of(extent.start()));
            if inner.regions.owned_by(extent, owner) {
                let mut g = inner.lock_arena(owner);
                if !inner.regions.owned_by(extent, owner) {
                    continue; // The region moved before we got the lock.
                }
                g.free(&inner.regions, extent)?;
                inner.publish(&g, owner);
                if owner == POOL && !g.empty.is_empty() && inner.crowded.load(Ordering::Relaxed) {
                    // A whole region is free again: arenas may lease.
                    inner.crowded.store(false, Ordering::Relaxed);
                }
                if owner != POOL && g.empty.len() > inner.config.keep_empty_regions {
                    inner.hand_back(&mut g, owner);
                }
                return Ok(());
            }
            if let Some(r) = inner.free_spanning(extent) {
                return r;
            }
        }
    }

    /// Counters of locks and slow paths since the allocator was made.
    pub fn stats(&self) -> SharedStats {
        let i = &*self.inner;
        let sum = |f: fn(&LockCounters) -> &AtomicU64| {
            i.locks.iter().map(|c| f(c).load(Ordering::Relaxed)).sum()
        };
        SharedStats {
            lock_acquisitions: sum(|c| &c.taken),
            lock_waits: sum(|c| &c.waited),
            leases: i.counters.leases.load(Ordering::Relaxed),
            hand_backs: i.counters.hand_backs.load(Ordering::Relaxed),
            fallbacks: i.counters.fallbacks.load(Ordering::Relaxed),
            reclaims: i.counters.reclaims.load(Ordering::Relaxed),
        }
    }

    /// Hands this thread's cached space back to the pool.
    pub fn flush(&self) {
        let me = self.my_arena();
        if me != POOL {
            self.inner.dissolve(me);
        }
    }

    /// Moves every thread's cached space back into the pool.
    pub fn reclaim(&self) {
        let mut all = self.inner.lock_all();
        self.inner.reclaim_locked(&mut all);
    }

    /// Space accounting over the whole device (locks every arena).
    pub fn status(&self) -> Status {
        let all = self.inner.lock_all();
        let mut free = Vec::new();
        for g in &all {
            g.engine.for_each_free_extent(&mut |e| free.push(e));
        }
        free.sort_unstable_by_key(|e| e.start());
        let mut b = StatusBuilder::new(self.inner.capacity);
        for e in free {
            b.push(e);
        }
        b.finish()
    }

    /// Free extents of the whole device in address order, maximal runs.
    pub fn free_extents(&self) -> Vec<Extent> {
        let all = self.inner.lock_all();
        let mut free = Vec::new();
        for g in &all {
            g.engine.for_each_free_extent(&mut |e| free.push(e));
        }
        free.sort_unstable_by_key(|e| e.start());
        let mut out: Vec<Extent> = Vec::with_capacity(free.len());
        for e in free {
            match out.last_mut() {
                Some(last) if last.end() == e.start() => {
                    *last = Extent::from_range(last.start(), e.end()).expect("non-empty");
                }
                _ => out.push(e),
            }
        }
        out
    }

    /// Bytes held by the engines and tables.
    pub fn memory_bytes(&self) -> usize {
        let engines: usize = self
            .inner
            .arenas
            .iter()
            .map(|a| {
                let g = lock(a);
                g.engine.memory_bytes() + g.table_bytes()
            })
            .sum();
        engines + self.inner.regions.count() as usize * std::mem::size_of::<u32>()
    }

    /// Checks every engine and the ownership and accounting that tie them
    /// together (locks every arena).
    ///
    /// # Errors
    /// A [`VerifyError`] naming what broke.
    pub fn verify(&self) -> Result<(), VerifyError> {
        self.inner.verify()
    }

    /// The arena index of the calling thread, binding one on first use.
    fn my_arena(&self) -> u32 {
        let inner = &self.inner;
        BINDINGS
            .try_with(|b| {
                let mut b = b.borrow_mut();
                if let Some(&(_, _, a)) = b.0.iter().find(|(id, _, _)| *id == inner.id) {
                    return a;
                }
                b.0.retain(|(_, w, _)| w.strong_count() > 0);
                let a = inner.bind();
                b.0.push((inner.id, Arc::downgrade(inner), a));
                a
            })
            // During thread teardown the bindings are gone: use the pool.
            .unwrap_or(POOL)
    }
}

/// What the shared handle has done, for measuring how it scales: how often
/// an arena lock was taken and how often the taker had to wait, and the
/// rare slow paths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedStats {
    /// Arena locks taken (about one per operation).
    pub lock_acquisitions: u64,
    /// Of those, how many found the lock held and had to wait.
    pub lock_waits: u64,
    /// Regions leased from the pool (batch refills).
    pub leases: u64,
    /// Empty regions handed back to the pool (batch returns).
    pub hand_backs: u64,
    /// Allocations served by the pool or another thread's arena because the
    /// caller's arena had no room and no region could be leased.
    pub fallbacks: u64,
    /// Times every arena was reclaimed before answering "no space".
    pub reclaims: u64,
}

#[derive(Debug, Default)]
struct Counters {
    leases: AtomicU64,
    hand_backs: AtomicU64,
    fallbacks: AtomicU64,
    reclaims: AtomicU64,
}

/// Per-arena lock counters, each on its own cache line with its arena.
#[derive(Debug, Default)]
struct LockCounters {
    taken: AtomicU64,
    waited: AtomicU64,
}

impl Inner {
    /// Locks arena `a`, counting whether we had to wait.
    #[inline]
    fn lock_arena(&self, a: u32) -> MutexGuard<'_, Arena> {
        let c = &self.locks[a as usize];
        c.taken.fetch_add(1, Ordering::Relaxed);
        match self.arenas[a as usize].try_lock() {
            Ok(g) => g,
            Err(_) => {
                c.waited.fetch_add(1, Ordering::Relaxed);
                lock(&self.arenas[a as usize])
            }
        }
    }

    /// Tries arena `a` alone: `Ok(None)` when it has no room. `refill` is
    /// what the arena may count on from the pool (see
    /// `SegFitAllocator::set_refill_blocks`): with it, an arena that would
    /// cut a fragment where the policy wants a long run has "no room", and
    /// the caller leases a region instead.
    fn try_arena(
        &self,
        a: u32,
        len: u64,
        hint: Option<u64>,
        refill: u64,
    ) -> Result<Option<Extent>, AllocError> {
        let mut g = self.lock_arena(a);
        g.engine.set_refill_blocks(refill);
        match g.allocate(&self.regions, len, hint) {
            Ok(e) => {
                self.publish(&g, a);
                Ok(Some(e))
            }
            Err(AllocError::NoSpace { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn publish(&self, g: &Arena, a: u32) {
        self.free[a as usize].store(g.free_blocks(), Ordering::Relaxed);
    }

    /// Moves one region with room for `len` blocks from the pool to arena
    /// `a`. False when the pool has none worth leasing.
    fn lease(&self, a: u32, len: u64) -> bool {
        let mut pool = self.lock_arena(POOL);
        // The region after this arena's last lease, so that its regions form
        // a run; a first lease starts at the arena's own stripe of the
        // device, so that arenas grow their runs apart. (The caller holds no
        // lock, so reading arena `a`'s last lease needs its lock, taken in
        // order after the pool's.)
        let count = self.regions.count();
        let preferred = {
            let g = self.lock_arena(a);
            match g.last_lease {
                Some(r) => r.checked_add(1).filter(|&n| n < count),
                None => {
                    let stripes = (self.arenas.len() - 1) as u64;
                    Some(((u64::from(a) - 1) * u64::from(count) / stripes) as u32)
                }
            }
        };
        let usable = |r: u32| self.regions.owner(r) == POOL && pool.is_empty(&self.regions, r);
        let r = match preferred.filter(|&r| usable(r)) {
            Some(r) => r,
            None => match pool.pop_empty(&self.regions, POOL) {
                Some(r) => r,
                None => {
                    // No empty region left: the pool region with the most
                    // free space, if that is a worthwhile batch.
                    let want = len.max(self.regions.blocks_per_region() / 8);
                    let best = (0..count)
                        .filter(|&r| self.regions.owner(r) == POOL)
                        .max_by_key(|&r| pool.region_free(r));
                    match best {
                        Some(r) if pool.region_free(r) >= want => r,
                        _ => {
                            // Nearly full: gather everything into the pool
                            // and serve from there (see `crowded`).
                            drop(pool);
                            let mut all = self.lock_all();
                            self.reclaim_locked(&mut all);
                            self.crowded.store(true, Ordering::Relaxed);
                            return false;
                        }
                    }
                }
            },
        };
        let mut g = self.lock_arena(a);
        pool.move_region(POOL, &mut g, a, &self.regions, r);
        g.last_lease = Some(r);
        self.counters.leases.fetch_add(1, Ordering::Relaxed);
        self.publish(&pool, POOL);
        self.publish(&g, a);
        true
    }

    /// Gives arena `a`'s extra empty regions back to the pool, if the pool
    /// is free right now (we hold `a`, so we must not wait for the pool).
    fn hand_back(&self, g: &mut MutexGuard<'_, Arena>, a: u32) {
        let Ok(mut pool) = self.arenas[POOL as usize].try_lock() else {
            return;
        };
        while g.empty.len() > self.config.keep_empty_regions {
            let Some(r) = g.pop_empty(&self.regions, a) else {
                break;
            };
            g.move_region(a, &mut pool, POOL, &self.regions, r);
            self.counters.hand_backs.fetch_add(1, Ordering::Relaxed);
        }
        self.publish(&pool, POOL);
        self.publish(g, a);
    }

    /// Frees an extent whose regions have different owners: every part is
    /// checked before any is freed. `None` when ownership changed meanwhile.
    fn free_spanning(&self, extent: Extent) -> Option<Result<(), FreeError>> {
        let mut owners: Vec<u32> = Vec::new();
        self.regions
            .pieces(extent, |r, _| owners.push(self.regions.owner(r)));
        owners.sort_unstable();
        owners.dedup();
        let mut guards: Vec<(u32, MutexGuard<'_, Arena>)> = owners
            .iter()
            .map(|&a| (a, lock(&self.arenas[a as usize])))
            .collect();
        let mut pieces = Vec::new();
        let mut stale = false;
        self.regions.pieces(extent, |r, p| {
            let o = self.regions.owner(r);
            stale |= owners.binary_search(&o).is_err();
            pieces.push((o, p));
        });
        if stale {
            return None;
        }
        let slot = |o: u32| owners.binary_search(&o).expect("owner was locked");
        for &(o, p) in &pieces {
            if let Err(e) = guards[slot(o)].1.engine.check_allocated(p) {
                return Some(Err(match e {
                    FreeError::NotAllocated { overlap, .. } => {
                        FreeError::NotAllocated { extent, overlap }
                    }
                    other => other,
                }));
            }
        }
        for &(o, p) in &pieces {
            guards[slot(o)]
                .1
                .free(&self.regions, p)
                .expect("checked just above under the same locks");
        }
        for (a, g) in &guards {
            self.publish(g, *a);
        }
        Some(Ok(()))
    }

    /// Locks every arena, pool first.
    fn lock_all(&self) -> Vec<MutexGuard<'_, Arena>> {
        self.arenas.iter().map(|a| lock(a)).collect()
    }

    /// Moves every thread arena's regions back to the pool.
    fn reclaim_locked(&self, all: &mut [MutexGuard<'_, Arena>]) {
        self.counters.reclaims.fetch_add(1, Ordering::Relaxed);
        let (pool, rest) = all.split_first_mut().expect("the pool exists");
        for (i, g) in rest.iter_mut().enumerate() {
            let a = i as u32 + 1;
            while let Some(&r) = g.regions.last() {
                g.move_region(a, pool, POOL, &self.regions, r);
            }
            g.clear_empty();
            self.publish(g, a);
        }
        self.publish(pool, POOL);
    }

    /// Hands arena `a`'s regions back to the pool.
    fn dissolve(&self, a: u32) {
        let mut pool = lock(&self.arenas[POOL as usize]);
        let mut g = lock(&self.arenas[a as usize]);
        while let Some(&r) = g.regions.last() {
            g.move_region(a, &mut pool, POOL, &self.regions, r);
        }
        g.clear_empty();
        self.publish(&pool, POOL);
        self.publish(&g, a);
    }

    /// Picks an arena for a new thread: an unused one, else the least shared.
    fn bind(&self) -> u32 {
        let mut bound = lock(&self.bound);
        let a = (1..bound.len())
            .min_by_key(|&i| bound[i])
            .expect("at least one thread arena");
        bound[a] += 1;
        a as u32
    }

    /// A thread bound to `a` is gone; the last one out hands its space back.
    fn unbind(&self, a: u32) {
        let mut bound = lock(&self.bound);
        bound[a as usize] -= 1;
        if bound[a as usize] == 0 {
            drop(bound);
            self.dissolve(a);
        }
    }

    fn verify(&self) -> Result<(), VerifyError> {
        let fail = |what: String| {
            Err(VerifyError {
                engine: SharedAllocator::NAME,
                what,
            })
        };
        let all = self.lock_all();
        let mut region_free = vec![0u64; self.regions.count() as usize];
        let mut total = 0u64;
        for (i, g) in all.iter().enumerate() {
            let a = i as u32;
            if let Err(e) = g.engine.verify() {
                return fail(format!("arena {a}: {e}"));
            }
            let mut bad = None;
            g.engine.for_each_free_extent(&mut |e| {
                self.regions.pieces(e, |r, p| {
                    if self.regions.owner(r) != a && bad.is_none() {
                        bad = Some((r, p));
                    }
                    region_free[r as usize] += p.len();
                });
            });
            if let Some((r, p)) = bad {
                return fail(format!(
                    "arena {a} holds free {p} in region {r}, owned by arena {}",
                    self.regions.owner(r)
                ));
            }
            if let Err(why) = g.check_lists() {
                return fail(format!("arena {a}: {why}"));
            }
            for &r in &g.regions {
                if self.regions.owner(r) != a {
                    return fail(format!(
                        "arena {a} lists region {r}, owned by {}",
                        self.regions.owner(r)
                    ));
                }
            }
            if a != POOL {
                let owned = (0..self.regions.count())
                    .filter(|&r| self.regions.owner(r) == a)
                    .count();
                if owned != g.regions.len() {
                    return fail(format!(
                        "arena {a} lists {} regions but owns {owned}",
                        g.regions.len()
                    ));
                }
            }
            let f = g.free_blocks();
            if self.free[i].load(Ordering::Relaxed) != f {
                return fail(format!("arena {a}: published free count is stale"));
            }
            total += f;
        }
        for (r, &f) in region_free.iter().enumerate() {
            let owner = self.regions.owner(r as u32);
            let counted = all[owner as usize].region_free(r as u32);
            if counted != f {
                return fail(format!(
                    "region {r}: arena {owner} counts {counted} free, engines hold {f}"
                ));
            }
        }
        if total > self.capacity {
            return fail(format!(
                "{total} free blocks on a {}-block device",
                self.capacity
            ));
        }
        Ok(())
    }
}

/// The handle as a plain [`Allocator`], for tools that drive one engine at a
/// time (the calling thread's arena serves it).
impl Allocator for SharedAllocator {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn capacity(&self) -> u64 {
        self.inner.capacity
    }
    fn used(&self) -> u64 {
        SharedAllocator::used(self)
    }
    fn allocate(&mut self, len: u64, hint: Option<u64>) -> Result<Extent, AllocError> {
        SharedAllocator::allocate(self, len, hint)
    }
    fn allocate_scattered(&mut self, len: u64, out: &mut Vec<Extent>) -> Result<(), AllocError> {
        SharedAllocator::allocate_scattered(self, len, out)
    }
    fn free(&mut self, extent: Extent) -> Result<(), FreeError> {
        SharedAllocator::free(self, extent)
    }
    fn status(&self) -> Status {
        SharedAllocator::status(self)
    }
    fn memory_bytes(&self) -> usize {
        SharedAllocator::memory_bytes(self)
    }
    fn for_each_free_extent(&self, f: &mut dyn FnMut(Extent)) {
        for e in SharedAllocator::free_extents(self) {
            f(e);
        }
    }
    fn verify(&self) -> Result<(), VerifyError> {
        SharedAllocator::verify(self)
    }
}
