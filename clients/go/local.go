package blockalloc

import (
	"fmt"
	"math/bits"
	"slices"
)

// localAlloc allocates inside the extents of one lease, with no I/O: the
// small, fast allocator of a leased region. The region grows when the
// lease is extended (addGrant) and when the server recycles freed blocks
// into it (addRecycled).
//
// Free space is a set of maximal runs. Each run is in a size class: runs
// of 1..smallClasses blocks in the class of their length, longer ones in
// one large class. Allocation pops the smallest class that fits (best fit,
// found through a bitmap of non-empty classes) and cuts the request from
// the front of the run; the rest goes back into its class. Free merges the
// freed extent with the runs that end where it starts and start where it
// ends, found in two maps, so free space never fragments into runs that
// touch. Added space (an extension, recycled blocks) merges the same way
// with the runs it touches: the server accepts a commit of an allocation
// that spans touching parts of a lease, so the lease packs as one
// allocator would.
//
// Invariants (checked by verify):
//   - runs are pairwise disjoint and no two touch (else they would have
//     merged);
//   - the region is sorted, and no two of its extents overlap or touch;
//   - every run lies inside one extent of the region;
//   - byStart[s].len == l and byEnd[s+l] == s for every run [s, s+l);
//   - every run sits in classes[class(l)] at index byStart[s].slot, and the
//     class's bit is set exactly when the class is non-empty;
//   - free == the sum of the runs' lengths;
//   - fragments == the sum of the lengths of the runs of at most
//     smallClasses blocks.
type localAlloc struct {
	region  []Extent
	byStart map[uint64]runInfo
	byEnd   map[uint64]uint64
	classes [smallClasses + 1][]uint64
	nonZero [(smallClasses + 64) / 64]uint64
	free    uint64
	// fragments: free blocks in runs of at most smallClasses blocks, which
	// commits and renewals report to the server (fragment_blocks).
	fragments uint64
}

type runInfo struct {
	len  uint64
	slot int
}

// smallClasses: runs up to 4 MiB of 4 KiB blocks (the objects this service
// is made for) get a class of their own length.
const smallClasses = 1024

func classOf(n uint64) int {
	if n > smallClasses {
		return smallClasses
	}
	return int(n - 1)
}

// newLocalAlloc is an allocator whose free space is region.
func newLocalAlloc(region []Extent) (*localAlloc, error) {
	a := &localAlloc{
		byStart: make(map[uint64]runInfo),
		byEnd:   make(map[uint64]uint64),
	}
	if err := a.addGrant(region); err != nil {
		return nil, err
	}
	return a, nil
}

// addGrant adds leased space: extents the server granted, which must not
// be free here already. Nothing changes when they are not valid.
//
// The check scans the free runs (a grant is rare, a few extents). It is
// made against the free runs, not the region: blocks that were allocated
// from the lease, committed and freed without being recycled are free on
// the server and may be granted again.
func (a *localAlloc) addGrant(es []Extent) error {
	sorted, err := sortedDisjoint(es, "leased")
	if err != nil {
		return err
	}
	for s, r := range a.byStart {
		run := Extent{Start: s, Len: r.len}
		if e, ok := overlapping(sorted, run); ok {
			return badReply("leased extent %s overlaps %s, free in the lease already", e, run)
		}
	}
	a.add(sorted)
	return nil
}

// addRecycled adds blocks the server recycled into the lease from a
// commit's frees: each must lie inside one of frees, which were committed
// allocations and so are not free here. Nothing changes when they are not
// valid.
func (a *localAlloc) addRecycled(es, frees []Extent) error {
	sorted, err := sortedDisjoint(es, "recycled")
	if err != nil {
		return err
	}
	freed := slices.Clone(frees)
	sortByStart(freed)
	for _, e := range sorted {
		if !within(freed, e) {
			return badReply("recycled extent %s is not part of the commit's frees", e)
		}
	}
	a.add(sorted)
	return nil
}

// sortedDisjoint is es sorted by start, or an error when one is empty or
// wraps, or two overlap.
func sortedDisjoint(es []Extent, what string) ([]Extent, error) {
	sorted := slices.Clone(es)
	sortByStart(sorted)
	for i, e := range sorted {
		if e.Len == 0 || e.Start+e.Len < e.Start {
			return nil, badReply("%s extent %s is empty or wraps", what, e)
		}
		if i > 0 && sorted[i-1].End() > e.Start {
			return nil, badReply("%s extents %s and %s overlap", what, sorted[i-1], e)
		}
	}
	return sorted, nil
}

// overlapping is an extent of sorted (disjoint, by start) that overlaps e,
// if any: the last one that starts before e ends, if it ends after e
// starts.
func overlapping(sorted []Extent, e Extent) (Extent, bool) {
	i, _ := slices.BinarySearchFunc(sorted, e.End(), func(x Extent, end uint64) int { return cmpU64(x.Start, end) })
	if i == 0 || sorted[i-1].End() <= e.Start {
		return Extent{}, false
	}
	return sorted[i-1], true
}

// within reports whether e lies inside one extent of sorted (disjoint, by
// start).
func within(sorted []Extent, e Extent) bool {
	x, ok := overlapping(sorted, e)
	return ok && x.Start <= e.Start && e.End() <= x.End()
}

// add makes sorted (valid, and not free here) free space of the region,
// each extent merged with the runs it touches.
func (a *localAlloc) add(sorted []Extent) {
	a.region = unionSorted(a.region, sorted)
	for _, e := range sorted {
		a.release(e)
	}
}

// unionSorted is the union of two sorted extent lists, with extents that
// overlap or touch merged, so that verify accepts runs that span them.
func unionSorted(x, y []Extent) []Extent {
	out := make([]Extent, 0, len(x)+len(y))
	for len(x) > 0 || len(y) > 0 {
		var e Extent
		if len(y) == 0 || (len(x) > 0 && x[0].Start <= y[0].Start) {
			e, x = x[0], x[1:]
		} else {
			e, y = y[0], y[1:]
		}
		if n := len(out); n > 0 && out[n-1].End() >= e.Start {
			out[n-1].Len = max(out[n-1].End(), e.End()) - out[n-1].Start
		} else {
			out = append(out, e)
		}
	}
	return out
}

func cmpU64(x, y uint64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

func (a *localAlloc) insert(s, l uint64) {
	c := classOf(l)
	a.byStart[s] = runInfo{len: l, slot: len(a.classes[c])}
	a.byEnd[s+l] = s
	a.classes[c] = append(a.classes[c], s)
	a.nonZero[c/64] |= 1 << (c % 64)
	a.free += l
	if l <= smallClasses {
		a.fragments += l
	}
}

func (a *localAlloc) remove(s uint64) uint64 {
	r := a.byStart[s]
	c := classOf(r.len)
	stack := a.classes[c]
	last := len(stack) - 1
	if r.slot != last {
		moved := stack[last]
		stack[r.slot] = moved
		m := a.byStart[moved]
		m.slot = r.slot
		a.byStart[moved] = m
	}
	a.classes[c] = stack[:last]
	if last == 0 {
		a.nonZero[c/64] &^= 1 << (c % 64)
	}
	delete(a.byStart, s)
	delete(a.byEnd, s+r.len)
	a.free -= r.len
	if r.len <= smallClasses {
		a.fragments -= r.len
	}
	return r.len
}

// firstClass is the smallest non-empty class at or above c, or -1.
func (a *localAlloc) firstClass(c int) int {
	w := c / 64
	word := a.nonZero[w] &^ (1<<(c%64) - 1)
	for {
		if word != 0 {
			return w*64 + bits.TrailingZeros64(word)
		}
		w++
		if w == len(a.nonZero) {
			return -1
		}
		word = a.nonZero[w]
	}
}

// alloc takes n contiguous blocks, or reports false when no run is long
// enough.
func (a *localAlloc) alloc(n uint64) (Extent, bool) {
	if n == 0 || n > a.free {
		return Extent{}, false
	}
	var s, l uint64
	c := a.firstClass(classOf(n))
	switch {
	case c < 0:
		return Extent{}, false
	case c < smallClasses:
		s = a.classes[c][len(a.classes[c])-1]
	default:
		// Long runs: the first that fits. There are few of them, since a
		// lease starts as one run and cuts small objects from it.
		found := false
		for _, cand := range a.classes[smallClasses] {
			if a.byStart[cand].len >= n {
				s, found = cand, true
				break
			}
		}
		if !found {
			return Extent{}, false
		}
	}
	l = a.remove(s)
	if l > n {
		a.insert(s+n, l-n)
	}
	return Extent{Start: s, Len: n}, true
}

// release gives e back, merging it with the runs it touches. The caller
// guarantees that e was allocated from this allocator (or is part of the
// region, at construction).
func (a *localAlloc) release(e Extent) {
	s, l := e.Start, e.Len
	if prev, ok := a.byEnd[s]; ok {
		pl := a.remove(prev)
		s, l = prev, l+pl
	}
	if _, ok := a.byStart[s+l]; ok {
		l += a.remove(s + l)
	}
	a.insert(s, l)
}

// verify checks every invariant listed on localAlloc; it costs O(r log r)
// for r runs and is meant for tests.
func (a *localAlloc) verify() error {
	runs := make([]Extent, 0, len(a.byStart))
	var sum, short uint64
	for s, r := range a.byStart {
		runs = append(runs, Extent{Start: s, Len: r.len})
		sum += r.len
		if r.len <= smallClasses {
			short += r.len
		}
		if r.len == 0 {
			return fmt.Errorf("empty run at %d", s)
		}
		if got, ok := a.byEnd[s+r.len]; !ok || got != s {
			return fmt.Errorf("run [%d, %d) missing from the end map", s, s+r.len)
		}
		c := classOf(r.len)
		if r.slot >= len(a.classes[c]) || a.classes[c][r.slot] != s {
			return fmt.Errorf("run [%d, %d) not at slot %d of class %d", s, s+r.len, r.slot, c)
		}
	}
	if len(a.byEnd) != len(runs) {
		return fmt.Errorf("%d runs but %d end entries", len(runs), len(a.byEnd))
	}
	total := 0
	for c := range a.classes {
		total += len(a.classes[c])
		set := a.nonZero[c/64]&(1<<(c%64)) != 0
		if set != (len(a.classes[c]) > 0) {
			return fmt.Errorf("class %d has %d runs but its bit is %v", c, len(a.classes[c]), set)
		}
	}
	if total != len(runs) {
		return fmt.Errorf("%d runs but %d class entries", len(runs), total)
	}
	if sum != a.free {
		return fmt.Errorf("runs hold %d blocks, free says %d", sum, a.free)
	}
	if short != a.fragments {
		return fmt.Errorf("short runs hold %d blocks, fragments says %d", short, a.fragments)
	}
	slices.SortFunc(runs, func(x, y Extent) int { return cmpU64(x.Start, y.Start) })
	for i, r := range runs {
		if i > 0 && runs[i-1].End() >= r.Start {
			return fmt.Errorf("runs %s and %s overlap or touch", runs[i-1], r)
		}
		if !a.inRegion(r) {
			return fmt.Errorf("run %s is outside the region", r)
		}
	}
	for i := 1; i < len(a.region); i++ {
		if a.region[i-1].End() >= a.region[i].Start {
			return fmt.Errorf("region extents %s and %s overlap or touch", a.region[i-1], a.region[i])
		}
	}
	return nil
}

// inRegion reports whether e lies inside one extent of the region.
func (a *localAlloc) inRegion(e Extent) bool {
	return within(a.region, e)
}

func sortByStart(s []Extent) {
	slices.SortFunc(s, func(x, y Extent) int { return cmpU64(x.Start, y.Start) })
}
