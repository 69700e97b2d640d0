//! [`Arena`]: one engine and the regions it owns.
//!
//! Arena 0 is the **pool**: it owns every region no thread has leased. The
//! others are thread arenas (the per-thread caches): a thread allocates from
//! its arena alone, under that arena's lock, and refills it by leasing whole
//! regions from the pool — a batch of space, traded in one locked step.
//!
//! Every arena's engine spans the whole device but holds, as free, only the
//! free space of the regions the arena owns; everything else looks allocated
//! to it. Moving a region between arenas is `take_free_range` on one engine
//! and `free` of the same extents on the other.

use std::num::NonZeroU32;

use blockalloc::{AllocError, Allocator, Extent, FreeError, FromFreeExtents, SegFitAllocator};

use crate::regions::Regions;

#[derive(Debug)]
pub(crate) struct Arena {
    pub(crate) engine: SegFitAllocator,
    /// What this arena knows of each region it owns (and of regions still
    /// listed in `empty`), keyed by region: memory proportional to the
    /// regions the arena holds, not to the device. Regions it has nothing
    /// to say about are absent.
    table: RegionTable,
    /// Regions this arena owns (thread arenas only; the pool owns the rest).
    pub(crate) regions: Vec<u32>,
    /// Regions that were seen entirely free; checked again when taken.
    pub(crate) empty: EmptyList,
    /// The region this arena leased last: the next lease prefers the one
    /// after it, so that an arena's regions form runs and the free space at
    /// the end of one region merges with the start of the next.
    pub(crate) last_lease: Option<u32>,
}

/// One region as an arena sees it. An entry equal to the default carries
/// nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RegionEntry {
    /// Free blocks, meaningful while the arena owns the region.
    free: u64,
    /// The region's index in `Arena::regions` plus one, or 0 when not
    /// listed there: lets a region leave in O(1). Invariant: `slot ==
    /// i + 1` for the region at `regions[i]`, 0 for every other region.
    slot: u32,
    /// Listed in `Arena::empty`.
    listed: bool,
}

/// Regions per page of a [`RegionTable`].
const PAGE_REGIONS: u32 = 64;

/// The entries of 64 consecutive regions, stored column by column (about
/// 12.2 bytes per region when full, as a dense array would take).
///
/// Invariant: `live` counts the regions whose entry is not the default.
#[derive(Debug)]
struct Page {
    /// Page number: regions `id * 64 .. id * 64 + 64`.
    id: u32,
    free: [u64; PAGE_REGIONS as usize],
    slot: [u32; PAGE_REGIONS as usize],
    /// Bit `i`: region `i` of the page is listed in `Arena::empty`.
    listed: u64,
    live: u32,
}

impl Page {
    fn new(id: u32) -> Page {
        Page {
            id,
            free: [0; PAGE_REGIONS as usize],
            slot: [0; PAGE_REGIONS as usize],
            listed: 0,
            live: 0,
        }
    }

    #[inline]
    fn entry(&self, i: usize) -> RegionEntry {
        RegionEntry {
            free: self.free[i],
            slot: self.slot[i],
            listed: self.listed & (1 << i) != 0,
        }
    }

    #[inline]
    fn set(&mut self, i: usize, e: RegionEntry) {
        self.free[i] = e.free;
        self.slot[i] = e.slot;
        self.listed = (self.listed & !(1 << i)) | (u64::from(e.listed) << i);
    }
}

/// Sparse per-region entries of one arena: pages of 64 regions, kept only
/// while one of their regions has a non-default entry, and a directory from
/// page number to page. A thread arena's leases form runs of neighbouring
/// regions, so they share pages; the pool, which holds most regions, ends
/// up with every page.
///
/// The directory costs 4 bytes per 64 regions up to the highest page the
/// arena has touched: at most 64 KiB with [`MAX_REGIONS`](crate::MAX_REGIONS)
/// regions, against 12 bytes per region of the device for dense arrays; in
/// exchange a lookup is two array reads, with no hashing on the hot path.
///
/// Invariants: `dir[pages[k].id] == k + 1` for every `k`, and every other
/// directory slot is `None`; every page has `live > 0`.
#[derive(Debug, Default)]
struct RegionTable {
    pages: Vec<Page>,
    dir: Vec<Option<NonZeroU32>>,
}

impl RegionTable {
    #[inline]
    fn split(r: u32) -> (u32, usize) {
        (r / PAGE_REGIONS, (r % PAGE_REGIONS) as usize)
    }

    /// The position of page `p`, if stored.
    #[inline(always)]
    fn find(&self, p: u32) -> Option<usize> {
        self.dir
            .get(p as usize)
            .copied()
            .flatten()
            .map(|k| k.get() as usize - 1)
    }

    #[inline]
    fn get(&self, r: u32) -> RegionEntry {
        let (p, i) = Self::split(r);
        self.find(p)
            .map_or_else(RegionEntry::default, |k| self.pages[k].entry(i))
    }

    /// Changes region `r`'s entry with `f`; a page whose entries all return
    /// to the default is dropped.
    #[inline]
    fn update<T>(&mut self, r: u32, f: impl FnOnce(&mut RegionEntry) -> T) -> T {
        let (p, i) = Self::split(r);
        let k = match self.find(p) {
            Some(k) => k,
            None => self.add_page(p),
        };
        let page = &mut self.pages[k];
        let before = page.entry(i);
        let mut e = before;
        let out = f(&mut e);
        page.set(i, e);
        let default = RegionEntry::default();
        if before == default && e != default {
            page.live += 1;
        } else if before != default && e == default {
            page.live -= 1;
        }
        if page.live == 0 {
            self.drop_page(k);
        }
        out
    }

    /// Adds `n` to region `r`'s free count, or takes `n` from it
    /// (`take`); returns the new count. The hot path of every allocation and
    /// free: one field changes, and the page's live count only when the
    /// entry becomes or stops being the default.
    #[inline(always)]
    fn add_free(&mut self, r: u32, n: u64, take: bool) -> u64 {
        let (p, i) = Self::split(r);
        let Some(k) = self.find(p) else {
            return self.update(r, |c| {
                c.free = if take { c.free - n } else { c.free + n };
                c.free
            });
        };
        let page = &mut self.pages[k];
        let was = page.free[i];
        let now = if take { was - n } else { was + n };
        page.free[i] = now;
        if (was == 0) != (now == 0) && page.slot[i] == 0 && page.listed & (1 << i) == 0 {
            if now == 0 {
                page.live -= 1;
                if page.live == 0 {
                    self.drop_page(k);
                }
            } else {
                page.live += 1;
            }
        }
        now
    }

    /// Stores an empty page `p`; returns its position.
    #[cold]
    fn add_page(&mut self, p: u32) -> usize {
        let k = self.pages.len();
        self.pages.push(Page::new(p));
        if self.dir.len() <= p as usize {
            self.dir.resize(p as usize + 1, None);
        }
        self.dir[p as usize] = NonZeroU32::new(k as u32 + 1);
        k
    }

    /// Removes the page at position `k` (rare: its last entry went back to
    /// the default).
    #[cold]
    fn drop_page(&mut self, k: usize) {
        let gone = self.pages.swap_remove(k);
        self.dir[gone.id as usize] = None;
        if let Some(moved) = self.pages.get(k) {
            self.dir[moved.id as usize] = NonZeroU32::new(k as u32 + 1);
        }
    }

    /// Every non-default entry, in no particular order.
    fn entries(&self) -> impl Iterator<Item = (u32, RegionEntry)> + '_ {
        self.pages.iter().flat_map(|page| {
            (0..PAGE_REGIONS as usize)
                .map(move |i| (page.id * PAGE_REGIONS + i as u32, page.entry(i)))
                .filter(|(_, e)| *e != RegionEntry::default())
        })
    }

    /// Checks the directory and the live counts.
    fn check(&self) -> Result<(), String> {
        let listed = self.dir.iter().filter(|d| d.is_some()).count();
        if listed != self.pages.len() {
            return Err(format!(
                "{listed} region pages in the directory, {} stored",
                self.pages.len()
            ));
        }
        for (k, page) in self.pages.iter().enumerate() {
            if self.find(page.id) != Some(k) {
                return Err(format!(
                    "region page {} is misplaced in the directory",
                    page.id
                ));
            }
            let live = (0..PAGE_REGIONS as usize)
                .filter(|&i| page.entry(i) != RegionEntry::default())
                .count();
            if live as u32 != page.live || live == 0 {
                return Err(format!(
                    "region page {} counts {} live entries, holds {live}",
                    page.id, page.live
                ));
            }
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.pages.capacity() * std::mem::size_of::<Page>()
            + self.dir.capacity() * std::mem::size_of::<Option<NonZeroU32>>()
    }
}

impl Arena {
    /// An arena with no space.
    pub(crate) fn empty(capacity: u64) -> Result<Arena, blockalloc::BuildError> {
        Ok(Arena {
            engine: SegFitAllocator::from_free_extents(capacity, &[])?,
            table: RegionTable::default(),
            regions: Vec::new(),
            empty: EmptyList::default(),
            last_lease: None,
        })
    }

    /// The pool of a device where exactly `free` is free: it owns every
    /// region.
    pub(crate) fn pool(
        regions: &Regions,
        capacity: u64,
        free: &[Extent],
    ) -> Result<Arena, blockalloc::BuildError> {
        let mut a = Arena::empty(capacity)?;
        a.engine = SegFitAllocator::from_free_extents(capacity, free)?;
        for &e in free {
            a.account(regions, e, false);
        }
        for r in (0..regions.count()).rev() {
            if a.is_empty(regions, r) {
                a.empty.push(&mut a.table, r);
            }
        }
        Ok(a)
    }

    /// Free blocks of region `r` (owned by this arena).
    pub(crate) fn region_free(&self, r: u32) -> u64 {
        self.table.get(r).free
    }

    /// True when region `r` (owned by this arena) is entirely free.
    pub(crate) fn is_empty(&self, regions: &Regions, r: u32) -> bool {
        self.region_free(r) == regions.extent(r).len()
    }

    /// Counts `e` as allocated (`alloc`) or freed in the region counters.
    #[inline]
    fn account(&mut self, regions: &Regions, e: Extent, alloc: bool) {
        let table = &mut self.table;
        regions.pieces(e, |r, p| {
            table.add_free(r, p.len(), alloc);
        });
    }

    /// Free blocks held.
    pub(crate) fn free_blocks(&self) -> u64 {
        self.engine.capacity() - self.engine.used()
    }

    /// Bytes of the per-region table and lists.
    pub(crate) fn table_bytes(&self) -> usize {
        self.table.bytes()
            + self.regions.capacity() * std::mem::size_of::<u32>()
            + self.empty.stack.capacity() * std::mem::size_of::<u32>()
    }

    #[inline(always)]
    pub(crate) fn allocate(
        &mut self,
        regions: &Regions,
        len: u64,
        hint: Option<u64>,
    ) -> Result<Extent, AllocError> {
        let e = self.engine.allocate(len, hint)?;
        self.account(regions, e, true);
        Ok(e)
    }

    /// Allocates `len` blocks scattered, appended to `out`.
    pub(crate) fn allocate_scattered(
        &mut self,
        regions: &Regions,
        len: u64,
        out: &mut Vec<Extent>,
    ) -> Result<(), AllocError> {
        let before = out.len();
        self.engine.allocate_scattered(len, out)?;
        for &e in &out[before..] {
            self.account(regions, e, true);
        }
        Ok(())
    }

    /// Frees `e`, which lies in regions this arena owns; notes regions that
    /// became entirely free.
    #[inline]
    pub(crate) fn free(&mut self, regions: &Regions, e: Extent) -> Result<(), FreeError> {
        self.engine.free(e)?;
        let (table, empty) = (&mut self.table, &mut self.empty);
        regions.pieces(e, |r, p| {
            if table.add_free(r, p.len(), false) == regions.extent(r).len() {
                empty.push(table, r);
            }
        });
        Ok(())
    }

    /// Checks the O(1) indexes over `regions` and `empty` against the lists.
    pub(crate) fn check_lists(&self) -> Result<(), String> {
        for (i, &r) in self.regions.iter().enumerate() {
            if self.table.get(r).slot as usize != i + 1 {
                return Err(format!("region {r} is listed at {i} but its slot is stale"));
            }
        }
        self.table.check()?;
        let slots = self.table.entries().filter(|(_, e)| e.slot != 0).count();
        if slots != self.regions.len() {
            return Err(format!(
                "{slots} region slots set for {} listed regions",
                self.regions.len()
            ));
        }
        self.empty.check(&self.table)
    }

    /// Takes one region this arena believes entirely free and that still is
    /// (owned by `me` and empty).
    pub(crate) fn pop_empty(&mut self, regions: &Regions, me: u32) -> Option<u32> {
        while let Some(r) = self.empty.pop(&mut self.table) {
            if regions.owner(r) == me && self.is_empty(regions, r) {
                return Some(r);
            }
        }
        None
    }

    /// Unlists every region from `empty`.
    pub(crate) fn clear_empty(&mut self) {
        while self.empty.pop(&mut self.table).is_some() {}
    }

    /// Gives region `r` and its free space from `self` (arena `from`) to
    /// `to` (arena `dest`). The caller holds both locks.
    pub(crate) fn move_region(
        &mut self,
        from: u32,
        to: &mut Arena,
        dest: u32,
        regions: &Regions,
        r: u32,
    ) {
        debug_assert_eq!(regions.owner(r), from);
        for e in self.engine.take_free_range(regions.extent(r)) {
            to.engine
                .free(e)
                .expect("space moved in is allocated in the receiving engine");
        }
        regions.set_owner(r, dest);
        let (free, listed) = self.table.update(r, |c| {
            let out = (c.free, c.slot);
            c.free = 0;
            c.slot = 0;
            out
        });
        to.table.update(r, |c| c.free = free);
        if listed != 0 {
            let i = listed as usize - 1;
            self.regions.swap_remove(i);
            if let Some(&moved) = self.regions.get(i) {
                self.table.update(moved, |c| c.slot = listed);
            }
        }
        if dest != crate::regions::POOL {
            to.regions.push(r);
            let slot = to.regions.len() as u32;
            to.table.update(r, |c| c.slot = slot);
        }
        if to.is_empty(regions, r) {
            to.empty.push(&mut to.table, r);
        }
    }
}

/// Regions an arena saw entirely free: a stack, with a membership flag per
/// region in the arena's table, so each region is listed at most once and
/// noting or taking one is O(1) however many regions the device has.
/// Entries are hints — a listed region may have been allocated from or
/// moved away since — and [`Arena::pop_empty`] checks each again.
///
/// Invariant: a region's `listed` flag is set iff it is in `stack`.
#[derive(Debug, Default)]
pub(crate) struct EmptyList {
    stack: Vec<u32>,
}

impl EmptyList {
    /// Lists region `r` unless it is listed already.
    fn push(&mut self, table: &mut RegionTable, r: u32) {
        let fresh = table.update(r, |c| !std::mem::replace(&mut c.listed, true));
        if fresh {
            self.stack.push(r);
        }
    }

    /// Takes the region listed last.
    fn pop(&mut self, table: &mut RegionTable) -> Option<u32> {
        let r = self.stack.pop()?;
        table.update(r, |c| c.listed = false);
        Some(r)
    }

    /// Regions listed.
    pub(crate) fn len(&self) -> usize {
        self.stack.len()
    }

    /// True when no region is listed.
    pub(crate) fn is_empty(&self) -> bool {
        self.stack.is_empty()
    }

    /// Checks that the flags match the stack and nothing is listed twice.
    fn check(&self, table: &RegionTable) -> Result<(), String> {
        let flags = table.entries().filter(|(_, e)| e.listed).count();
        if flags != self.stack.len() {
            return Err(format!(
                "{flags} empty-region flags set for {} listed regions",
                self.stack.len()
            ));
        }
        match self.stack.iter().find(|&&r| !table.get(r).listed) {
            Some(r) => Err(format!("region {r} is listed as empty without its flag")),
            None => Ok(()),
        }
    }
}
