package blockalloc

import (
	"errors"
	"math/rand/v2"
	"testing"
)

func mustLocal(t *testing.T, region ...Extent) *localAlloc {
	t.Helper()
	a, err := newLocalAlloc(region)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.verify(); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestLocalAllocCutsFromTheFrontAndMergesOnFree(t *testing.T) {
	a := mustLocal(t, Extent{Start: 100, Len: 10})
	x, ok := a.alloc(3)
	if !ok || x != (Extent{100, 3}) {
		t.Fatalf("alloc(3) = %v %v", x, ok)
	}
	y, _ := a.alloc(3)
	z, _ := a.alloc(4)
	if y != (Extent{103, 3}) || z != (Extent{106, 4}) {
		t.Fatalf("got %v %v", y, z)
	}
	if _, ok := a.alloc(1); ok {
		t.Fatal("allocated from a full region")
	}
	// Free the middle, then both sides: one run of 10 again.
	for _, e := range []Extent{y, x, z} {
		a.release(e)
		if err := a.verify(); err != nil {
			t.Fatal(err)
		}
	}
	if len(a.byStart) != 1 || a.free != 10 {
		t.Fatalf("want one run of 10, got %d runs, %d free", len(a.byStart), a.free)
	}
	if e, ok := a.alloc(10); !ok || e != (Extent{100, 10}) {
		t.Fatalf("alloc(10) after merging = %v %v", e, ok)
	}
}

func TestLocalAllocPrefersTheSmallestRunThatFits(t *testing.T) {
	a := mustLocal(t, Extent{0, 5}, Extent{10, 2}, Extent{20, 3000})
	if e, _ := a.alloc(2); e != (Extent{10, 2}) {
		t.Fatalf("alloc(2) = %v, want the run of exactly 2", e)
	}
	if e, _ := a.alloc(4); e != (Extent{0, 4}) {
		t.Fatalf("alloc(4) = %v, want the run of 5", e)
	}
	if e, _ := a.alloc(2000); e != (Extent{20, 2000}) {
		t.Fatalf("alloc(2000) = %v", e)
	}
	if _, ok := a.alloc(1001); ok {
		t.Fatal("allocated 1001 blocks with a longest run of 1000")
	}
	if err := a.verify(); err != nil {
		t.Fatal(err)
	}
}

func TestLocalAllocRegionsThatTouchMergeAndVerify(t *testing.T) {
	a := mustLocal(t, Extent{10, 5}, Extent{0, 10})
	if e, ok := a.alloc(15); !ok || e != (Extent{0, 15}) {
		t.Fatalf("alloc(15) over two touching extents = %v %v", e, ok)
	}
}

func TestLocalAllocRejectsOverlappingOrEmptyRegions(t *testing.T) {
	for _, r := range [][]Extent{
		{{0, 10}, {5, 10}},
		{{0, 0}},
		{{^uint64(0) - 1, 5}},
	} {
		if _, err := newLocalAlloc(r); err == nil {
			t.Errorf("newLocalAlloc(%v) accepted a bad region", r)
		}
	}
}

func TestVerifyCatchesACorruptedAllocator(t *testing.T) {
	a := mustLocal(t, Extent{0, 100})
	a.alloc(10)
	a.free++
	if a.verify() == nil {
		t.Fatal("verify missed a wrong free count")
	}
	a.free--
	// Two runs that touch: insert behind the allocator's back.
	a.insert(5, 5)
	if a.verify() == nil {
		t.Fatal("verify missed touching runs")
	}
}

// The allocator against a model (one owner per block), with random sizes
// and frees, checked after every step.
func TestLocalAllocAgainstAModel(t *testing.T) {
	const size = 50_000
	rng := rand.New(rand.NewPCG(1, 2))
	a := mustLocal(t, Extent{1000, size / 2}, Extent{1000 + size/2 + 7, size / 2})
	owner := make(map[uint64]int) // block -> allocation id
	var live []Extent
	for step := range 20_000 {
		if len(live) > 0 && rng.IntN(100) < 45 {
			i := rng.IntN(len(live))
			e := live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			for b := e.Start; b < e.End(); b++ {
				delete(owner, b)
			}
			a.release(e)
		} else {
			n := 1 + uint64(rng.IntN(1500))
			e, ok := a.alloc(n)
			if ok {
				if e.Len != n || !a.inRegion(e) {
					t.Fatalf("step %d: alloc(%d) = %v", step, n, e)
				}
				for b := e.Start; b < e.End(); b++ {
					if _, taken := owner[b]; taken {
						t.Fatalf("step %d: block %d allocated twice", step, b)
					}
					owner[b] = step
				}
				live = append(live, e)
			} else if a.largestRun() >= n {
				t.Fatalf("step %d: alloc(%d) failed with a run of %d", step, n, a.largestRun())
			}
		}
		if uint64(len(owner))+a.free != size {
			t.Fatalf("step %d: %d allocated + %d free != %d", step, len(owner), a.free, size)
		}
		if step%97 == 0 {
			if err := a.verify(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
	for _, e := range live {
		a.release(e)
	}
	if err := a.verify(); err != nil {
		t.Fatal(err)
	}
	if len(a.byStart) != 2 || a.free != size {
		t.Fatalf("after freeing everything: %d runs, %d free", len(a.byStart), a.free)
	}
}

func (a *localAlloc) largestRun() uint64 {
	var m uint64
	for _, r := range a.byStart {
		m = max(m, r.len)
	}
	return m
}

func BenchmarkLocalAlloc(b *testing.B) {
	a, _ := newLocalAlloc([]Extent{{0, 1 << 22}})
	rng := rand.New(rand.NewPCG(3, 4))
	live := make([]Extent, 0, 4096)
	b.ResetTimer()
	for range b.N {
		if len(live) == cap(live) {
			for _, e := range live[:len(live)/2] {
				a.release(e)
			}
			live = append(live[:0], live[len(live)/2:]...)
		}
		e, ok := a.alloc(1 + uint64(rng.IntN(1024)))
		if !ok {
			b.Fatal("full")
		}
		live = append(live, e)
	}
}

// Added space (an extension, recycled blocks) merges with the runs it
// touches, as a free does: the server accepts an allocation that spans
// touching parts of a lease, so a run may span them too.
func TestLocalAllocMergesAddedSpaceWithTheRunsItTouches(t *testing.T) {
	a := mustLocal(t, Extent{0, 10})
	if err := a.addGrant([]Extent{{10, 10}}); err != nil {
		t.Fatal(err)
	}
	if len(a.byStart) != 1 || a.largestRun() != 20 {
		t.Fatalf("%d runs, the longest %d; want one run of 20 across the grant's edge", len(a.byStart), a.largestRun())
	}
	x, ok := a.alloc(15)
	if !ok || x != (Extent{0, 15}) {
		t.Fatalf("alloc(15) = %s %v, want [0, 15) across the edge of the grant", x, ok)
	}
	y, _ := a.alloc(5)
	a.release(x)
	a.release(y)
	if err := a.verify(); err != nil {
		t.Fatal(err)
	}
	if e, ok := a.alloc(20); !ok || e != (Extent{0, 20}) {
		t.Fatalf("alloc(20) = %s %v after freeing both sides, want one run again", e, ok)
	}
	a.release(Extent{0, 20})
	// Committed blocks leave the lease; recycled, they join the run they
	// were cut from.
	z, _ := a.alloc(10)
	if err := a.addRecycled([]Extent{z}, []Extent{{0, 20}}); err != nil {
		t.Fatal(err)
	}
	if a.free != 20 {
		t.Fatalf("%d free, want 20", a.free)
	}
	if err := a.verify(); err != nil {
		t.Fatal(err)
	}
	if len(a.byStart) != 1 || a.largestRun() != 20 {
		t.Fatalf("%d runs, the longest %d; want the recycled blocks merged into one run of 20", len(a.byStart), a.largestRun())
	}
}

// Space the server adds is checked first; a bad addition changes nothing.
func TestLocalAllocRefusesBadAdditions(t *testing.T) {
	a := mustLocal(t, Extent{0, 10})
	for _, add := range []func() error{
		func() error { return a.addGrant([]Extent{{5, 10}}) },                       // free here already
		func() error { return a.addGrant([]Extent{{20, 5}, {22, 5}}) },              // overlapping
		func() error { return a.addRecycled([]Extent{{30, 5}}, []Extent{{30, 4}}) }, // not all freed
		func() error { return a.addRecycled([]Extent{{40, 0}}, []Extent{{40, 4}}) }, // empty
	} {
		if err := add(); !errors.Is(err, ErrBadReply) {
			t.Errorf("bad addition: %v, want ErrBadReply", err)
		}
	}
	if err := a.verify(); err != nil || a.free != 10 || len(a.region) != 1 {
		t.Fatalf("after refused additions: %v, %d free, region %v", err, a.free, a.region)
	}
}

// fragments counts the free blocks in runs of at most smallClasses blocks,
// as runs are cut, freed and merged.
func TestLocalAllocCountsItsFragments(t *testing.T) {
	a := mustLocal(t, Extent{Start: 0, Len: 4096})
	step := func(want uint64) {
		t.Helper()
		if err := a.verify(); err != nil {
			t.Fatal(err)
		}
		if a.fragments != want {
			t.Fatalf("fragments %d, want %d", a.fragments, want)
		}
	}
	step(0)
	x, _ := a.alloc(1000)
	step(0) // 3096 left in one long run
	y, _ := a.alloc(2500)
	step(596) // the tail
	a.release(x)
	step(1596)
	a.release(y)
	step(0) // all merged into one long run again
}
