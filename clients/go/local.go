package blockalloc

import (
	"fmt"
	"math/bits"
	"slices"
)

// localAlloc allocates inside the extents of one lease, with no I/O: the
// small, fast allocator of a leased region.
//
// Free space is a set of maximal runs. Each run is in a size class: runs of
// 1..smallClasses blocks in the class of their length, longer ones in one
// large class. Allocation pops the smallest class that fits (best fit,
// found through a bitmap of non-empty classes) and cuts the request from
// the front of the run; the rest goes back into its class. Free merges the
// freed extent with the runs that end where it starts and start where it
// ends, found in two maps, so free space never fragments into runs that
// touch.
//
// Invariants (checked by verify):
//   - runs are pairwise disjoint and no two touch (they would have merged);
//   - every run lies inside one extent of the region;
//   - byStart[s].len == l and byEnd[s+l] == s for every run [s, s+l);
//   - every run sits in classes[class(l)] at index byStart[s].slot, and the
//     class's bit is set exactly when the class is non-empty;
//   - free == the sum of the runs' lengths.
type localAlloc struct {
	region  []Extent
	byStart map[uint64]runInfo
	byEnd   map[uint64]uint64
	classes [smallClasses + 1][]uint64
	nonZero [(smallClasses + 64) / 64]uint64
	free    uint64
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
	sorted := slices.Clone(region)
	slices.SortFunc(sorted, func(x, y Extent) int { return cmpU64(x.Start, y.Start) })
	for i, e := range sorted {
		if e.Len == 0 || e.Start+e.Len < e.Start {
			return nil, badReply("leased extent %s is empty or wraps", e)
		}
		if i > 0 && sorted[i-1].End() > e.Start {
			return nil, badReply("leased extents %s and %s overlap", sorted[i-1], e)
		}
	}
	for _, e := range sorted {
		// Extents that touch become one run, and one extent of the region,
		// so that verify accepts runs that span them.
		if n := len(a.region); n > 0 && a.region[n-1].End() == e.Start {
			a.region[n-1].Len += e.Len
		} else {
			a.region = append(a.region, e)
		}
		a.release(e)
	}
	return a, nil
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
	var sum uint64
	for s, r := range a.byStart {
		runs = append(runs, Extent{Start: s, Len: r.len})
		sum += r.len
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
	slices.SortFunc(runs, func(x, y Extent) int { return cmpU64(x.Start, y.Start) })
	for i, r := range runs {
		if i > 0 && runs[i-1].End() >= r.Start {
			return fmt.Errorf("runs %s and %s overlap or touch", runs[i-1], r)
		}
		if !a.inRegion(r) {
			return fmt.Errorf("run %s is outside the region", r)
		}
	}
	return nil
}

// inRegion reports whether e lies inside one extent of the region.
func (a *localAlloc) inRegion(e Extent) bool {
	for _, r := range a.region {
		if e.Start >= r.Start && e.End() <= r.End() {
			return true
		}
	}
	return false
}

func sortByStart(s []Extent) {
	slices.SortFunc(s, func(x, y Extent) int { return cmpU64(x.Start, y.Start) })
}
