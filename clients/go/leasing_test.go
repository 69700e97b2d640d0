package blockalloc

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

func TestLeasingAllocatesLocallyCommitsAndReturnsTheRemainderOnClose(t *testing.T) {
	s := startServer(t, serverOpts{size: "256MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	st0 := devStatus(t, c)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 1024, CommitInterval: time.Hour})
	// Hold the background loop, so that "before commit" does not depend on
	// how soon it runs.
	resume := l.pause()
	var got []Extent
	for i := range 200 {
		e, err := l.Allocate(ctx, uint64(1+i%37))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	disjoint(t, got)
	stats := l.Stats()
	if stats.LocalAllocations != 200 || stats.Leases == 0 || stats.RemoteAllocations != 0 {
		t.Fatalf("stats %+v: want 200 local allocations from leases", stats)
	}
	// Uncommitted: the server counts them as leased, not used. (Once a
	// background extension is done: while the server journals one, its
	// blocks may show as used.)
	eventually(t, 30*time.Second, "the background extension did not end", func() bool { return !l.growing.Load() })
	if st := devStatus(t, c); st.UsedBlocks != st0.UsedBlocks || st.Leases == 0 {
		t.Fatalf("before commit: %v", st)
	}
	resume()
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st := devStatus(t, c); st.UsedBlocks != st0.UsedBlocks+sumExtents(got) {
		t.Fatalf("after commit: used %d, want %d", st.UsedBlocks, st0.UsedBlocks+sumExtents(got))
	}
	for _, e := range got[:100] {
		if err := l.Free(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st := devStatus(t, c)
	if st.UsedBlocks != st0.UsedBlocks+sumExtents(got[100:]) || st.Leases != 0 || st.LeasedUnusedBlocks != 0 ||
		st.FreeBlocks != st.CapacityBlocks-st.UsedBlocks {
		t.Fatalf("after Close: %v; want used %d, no lease", st, st0.UsedBlocks+sumExtents(got[100:]))
	}
	if _, err := l.Allocate(ctx, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Allocate after Close: %v, want ErrClosed", err)
	}
}

// An uncommitted allocation freed goes back to its lease at once: nothing
// of it reaches the server.
func TestLeasingFreeOfAnUncommittedAllocationStaysLocal(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 256, CommitInterval: time.Hour})
	defer l.Close(ctx)
	a, err := l.Allocate(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Free(a); err != nil {
		t.Fatal(err)
	}
	b, err := l.Allocate(ctx, 16)
	if err != nil || b != a {
		t.Fatalf("reallocation after a local free: %s %v, want %s again", b, err, a)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := l.Stats().CommitCalls; n != 1 {
		t.Fatalf("%d commit calls, want 1", n)
	}
}

// A free the server refuses (space that is not allocated) comes back from
// Commit as the server's refusal, and the allocator keeps working.
func TestLeasingReportsARefusedCommit(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 256})
	defer l.Close(ctx)
	if _, err := l.Allocate(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	st := devStatus(t, c)
	// The last block of the device is free (leases come from the front).
	if err := l.Free(Extent{Start: st.CapacityBlocks - 1, Len: 1}); err != nil {
		t.Fatal(err)
	}
	var ref *RefusedError
	if err := l.Commit(ctx); !errors.As(err, &ref) || ref.Code != codes.FailedPrecondition {
		t.Fatalf("commit of a free of free space: %v, want FAILED_PRECONDITION", err)
	}
	e, err := l.Allocate(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatalf("commit after a refusal: %v", err)
	}
	if _, err := c.Free(ctx, e); err != nil {
		t.Fatalf("the allocation after the refusal is not durable: %v", err)
	}
}

// Many goroutines allocate and free through one Leasing; no block is
// handed out twice, and what the server counts as used is exactly what
// the goroutines hold. Run with -race.
func TestLeasingConcurrentGoroutinesNeverShareABlock(t *testing.T) {
	s := startServer(t, serverOpts{size: "256MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	st0 := devStatus(t, c)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 1024, CommitInterval: time.Millisecond})
	const workers, ops = 8, 400
	held := make([][]Extent, workers)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			var mine []Extent
			for i := range ops {
				if len(mine) > 0 && rng.IntN(3) == 0 {
					k := rng.IntN(len(mine))
					if err := l.Free(mine[k]); err != nil {
						errs <- err
						return
					}
					mine = slices.Delete(mine, k, k+1)
					continue
				}
				e, err := l.Allocate(ctx, 1+uint64(rng.IntN(64)))
				if err != nil {
					errs <- err
					return
				}
				mine = append(mine, e)
				if i%50 == 0 {
					if err := l.Commit(ctx); err != nil {
						errs <- err
						return
					}
				}
			}
			held[w] = mine
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var all []Extent
	for _, h := range held {
		all = append(all, h...)
	}
	disjoint(t, all)
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st := devStatus(t, c)
	if st.UsedBlocks != st0.UsedBlocks+sumExtents(all) || st.Leases != 0 {
		t.Fatalf("after Close: used %d (leases %d), want %d", st.UsedBlocks, st.Leases, st0.UsedBlocks+sumExtents(all))
	}
	// Every held extent is committed: the server frees each of them.
	for i := 0; i < len(all); i += MaxBatch {
		if _, err := c.Free(ctx, all[i:min(i+MaxBatch, len(all))]...); err != nil {
			t.Fatal(err)
		}
	}
}

// A lease whose renewals stop expires on the server; the allocations made
// in it and not committed are reported lost, the committed ones stay, and
// the allocator takes a new lease.
func TestLeaseExpiryReportsLostAllocations(t *testing.T) {
	beforeExpiry(t, time.Second, func(t testing.TB) {
		s := startServer(t, serverOpts{size: "64MiB", leaseTTL: "1"})
		c := s.dial(t)
		ctx := ctxT(t)
		st0 := devStatus(t, c)
		l := c.NewLeasing(LeaseOptions{MinBlocks: 256})
		defer l.Close(ctx)
		kept, err := l.Allocate(ctx, 8)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		// Renewals keep the lease alive across several TTLs.
		time.Sleep(3 * time.Second)
		if st := devStatus(t, c); st.Leases != 1 {
			t.Fatalf("a renewed lease is gone: %v", st)
		}
		resume := l.pause()
		var lost []Extent
		for range 3 {
			e, err := l.Allocate(ctx, 4)
			if err != nil {
				t.Fatal(err)
			}
			lost = append(lost, e)
		}
		eventually(t, 10*time.Second, "the lease did not expire", func() bool {
			st := devStatus(t, c)
			return st.Leases == 0 && st.LeasedUnusedBlocks == 0
		})
		resume()
		err = l.Commit(ctx)
		var le *LostError
		if !errors.Is(err, ErrLost) || !errors.As(err, &le) {
			t.Fatalf("commit after expiry: %v, want ErrLost", err)
		}
		sortByStart(le.Extents)
		sortByStart(lost)
		if !slices.Equal(le.Extents, lost) {
			t.Fatalf("lost %v, want %v", le.Extents, lost)
		}
		if st := devStatus(t, c); st.UsedBlocks != st0.UsedBlocks+kept.Len {
			t.Fatalf("used %d, want the committed %d blocks only", st.UsedBlocks, kept.Len)
		}
		// Reported once; the allocator keeps working with a new lease.
		e, err := l.Allocate(ctx, 4)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Commit(ctx); err != nil {
			t.Fatalf("commit after the loss was reported: %v", err)
		}
		if n := l.Stats().Leases; n < 2 {
			t.Fatalf("%d leases, want a new one after the expiry", n)
		}
		if _, err := c.Free(ctx, kept, e); err != nil {
			t.Fatalf("committed allocations are not allocated on the server: %v", err)
		}
	})
}

// A client that goes away without releasing its lease (its connection
// closed, no renewals) does not keep the space: the lease expires.
func TestAbandonedLeaseExpiresOnTheServer(t *testing.T) {
	beforeExpiry(t, time.Second, func(t testing.TB) {
		s := startServer(t, serverOpts{size: "64MiB", leaseTTL: "1"})
		watcher := s.dial(t)
		st0 := devStatus(t, watcher)
		c, err := Dial(s.addr, Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxT(t)
		l := c.NewLeasing(LeaseOptions{MinBlocks: 512})
		if _, err := l.Allocate(ctx, 10); err != nil {
			t.Fatal(err)
		}
		if err := l.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		resume := l.pause()
		defer resume()
		if _, err := l.Allocate(ctx, 10); err != nil {
			t.Fatal(err)
		}
		if st := devStatus(t, watcher); st.LeasedUnusedBlocks == 0 {
			t.Fatalf("no leased space while the lease lives: %v", st)
		}
		_ = c.Close()
		eventually(t, 10*time.Second, "the abandoned lease did not expire", func() bool {
			st := devStatus(t, watcher)
			return st.Leases == 0 && st.LeasedUnusedBlocks == 0
		})
		if st := devStatus(t, watcher); st.UsedBlocks != st0.UsedBlocks+10 || st.FreeBlocks != st.CapacityBlocks-st.UsedBlocks {
			t.Fatalf("after expiry: %v; want only the committed 10 blocks used", st)
		}
	})
}

// SIGKILL the server and restart it on the same device within the leases'
// TTL: the restarted server restores the lease, so the allocations not
// committed at the kill are committed after it and none is lost (they used
// to be reported lost), and the client keeps working on the same lease.
func TestServerRestartWithinTheTTLLosesNothing(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB", leaseTTL: "60"})
	c := s.dial(t)
	ctx := ctxT(t)
	st0 := devStatus(t, c)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 256})
	defer l.Close(ctx)
	var committed []Extent
	for range 5 {
		e, err := l.Allocate(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		committed = append(committed, e)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	lease := l.LeaseIDs()
	resume := l.pause()
	var pending []Extent
	for range 4 {
		e, err := l.Allocate(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, e)
	}
	s.kill()
	s.restart()
	resume()
	var err error
	for range 200 {
		// Commits fail as unavailable (or cut off) until the server is
		// back; each is sent again with its sequence number.
		if err = l.Commit(ctx); !errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrOutcomeUnknown) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("commit after a server restart within the TTL: %v, want none lost", err)
	}
	if st := l.Stats(); st.Lost != 0 {
		t.Fatalf("%d allocations lost across a restart within the TTL", st.Lost)
	}
	all := append(slices.Clone(committed), pending...)
	if st := devStatus(t, c); st.UsedBlocks != st0.UsedBlocks+sumExtents(all) {
		t.Fatalf("after restart: used %d, want %d + the %d blocks allocated", st.UsedBlocks, st0.UsedBlocks, sumExtents(all))
	}
	e, err := l.Allocate(ctx, 7)
	if err != nil {
		t.Fatalf("allocate after a restart: %v", err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := l.LeaseIDs(); !slices.Equal(ids, lease) {
		t.Fatalf("leases %v after the restart, want the same lease %v", ids, lease)
	}
	for _, x := range append(all, e) {
		if err := l.Free(x); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st := devStatus(t, c); st.UsedBlocks != st0.UsedBlocks {
		t.Fatalf("after freeing everything: used %d, want %d", st.UsedBlocks, st0.UsedBlocks)
	}
}

// Near full, the space a request needs may sit in this client's own lease:
// the allocator gives its leases back before it reports no space.
func TestLeasingGivesBackItsLeasesBeforeReportingNoSpace(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 1, WantBlocks: 4096})
	defer l.Close(ctx)
	small, err := l.Allocate(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	st := devStatus(t, c)
	if st.LeasedUnusedBlocks == 0 {
		t.Fatalf("no lease held: %v", st)
	}
	// More than the unleased free space, less than all free space.
	n := st.FreeBlocks + st.LeasedUnusedBlocks/2
	e, err := l.Allocate(ctx, n)
	if err != nil {
		t.Fatalf("Allocate(%d) with %d free and %d in our lease: %v", n, st.FreeBlocks, st.LeasedUnusedBlocks, err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	disjoint(t, []Extent{small, e})
	if _, err := c.Free(ctx, small, e); err != nil {
		t.Fatalf("both allocations are committed: %v", err)
	}
}

// Before it reports no space, the allocator commits and gives back its
// leases; allocations found lost on the way are left for the next Commit,
// which reports them once, and Allocate gives its own answer: the
// server's refusal.
func TestLeasingLeavesALossFoundWhileGivingBackForCommit(t *testing.T) {
	beforeExpiry(t, time.Second, func(t testing.TB) {
		s := startServer(t, serverOpts{size: "64MiB", leaseTTL: "1"})
		c := s.dial(t)
		ctx := ctxT(t)
		l := c.NewLeasing(LeaseOptions{MinBlocks: 32, CommitInterval: time.Hour})
		defer l.Close(ctx)
		lost, err := l.Allocate(ctx, 8)
		if err != nil {
			t.Fatal(err)
		}
		ids := l.LeaseIDs()
		if len(ids) != 1 {
			t.Fatalf("leases %v, want one", ids)
		}
		// Another client ends the lease behind the allocator's back.
		other := s.dial(t)
		if _, err := other.rpc.Release(ctx, &pb.ReleaseRequest{LeaseId: ids[0]}); err != nil {
			t.Fatal(err)
		}
		// A renewal finds the lease gone; the loss waits for Commit.
		eventually(t, 10*time.Second, "the allocator never noticed its lease was gone", func() bool {
			return !slices.Equal(l.LeaseIDs(), ids)
		})
		// A new lease serves the next allocation.
		kept, err := l.Allocate(ctx, 8)
		if err != nil {
			t.Fatal(err)
		}
		if got := l.LeaseIDs(); len(got) != 1 || got[0] == ids[0] {
			t.Fatalf("leases %v, want one new lease", got)
		}
		// More than the device holds: the grant and the per-call Allocate are
		// refused, and the allocator commits and gives back its lease first.
		_, err = l.Allocate(ctx, 1<<20)
		noSpaceOf(t, "Allocate of more than the device", err)
		var le *LostError
		if err := l.Commit(ctx); !errors.As(err, &le) || !slices.Equal(le.Extents, []Extent{lost}) {
			t.Fatalf("Commit after the give-back: %v, want the allocation %s reported lost", err, lost)
		}
		if n := l.Stats().Lost; n != 1 {
			t.Fatalf("%d allocations lost, want 1", n)
		}
		if err := l.Commit(ctx); err != nil {
			t.Fatalf("Commit after the loss was reported: %v", err)
		}
		if _, err := c.Free(ctx, kept); err != nil {
			t.Fatalf("the allocation in the new lease is not committed: %v", err)
		}
	})
}

// A batch the server refuses during the give-back (a bad free) is reported
// by the next Commit, not by the Allocate that gave back, which reports no
// space; the batch's allocation is sent again alone and becomes durable.
func TestLeasingLeavesARefusalFoundWhileGivingBackForCommit(t *testing.T) {
	beforeExpiry(t, time.Second, func(t testing.TB) {
		s := startServer(t, serverOpts{size: "64MiB", leaseTTL: "1"})
		c := s.dial(t)
		ctx := ctxT(t)
		l := c.NewLeasing(LeaseOptions{MinBlocks: 32, CommitInterval: time.Hour})
		defer l.Close(ctx)
		good, err := l.Allocate(ctx, 8)
		if err != nil {
			t.Fatal(err)
		}
		// The last block of the device is free (leases come from the front).
		st := devStatus(t, c)
		if err := l.Free(Extent{Start: st.CapacityBlocks - 1, Len: 1}); err != nil {
			t.Fatal(err)
		}
		_, err = l.Allocate(ctx, 1<<20)
		noSpaceOf(t, "Allocate of more than the device", err)
		var ref *RefusedError
		if err := l.Commit(ctx); !errors.As(err, &ref) || ref.Code != codes.FailedPrecondition {
			t.Fatalf("Commit after the give-back: %v, want the refusal of the free (FAILED_PRECONDITION)", err)
		}
		if err := l.Commit(ctx); err != nil {
			t.Fatalf("Commit after the refusal was reported: %v", err)
		}
		if n := l.Stats().Lost; n != 0 {
			t.Fatalf("%d allocations lost", n)
		}
		if _, err := c.Free(ctx, good); err != nil {
			t.Fatalf("the allocation of the refused batch is not durable: %v", err)
		}
	})
}

// A bad free sent in the same commit as good allocations makes the server
// refuse the whole batch; the allocations are sent again alone and become
// durable, instead of being lost with the lease.
func TestRefusedFreeDoesNotLoseTheAllocationsOfItsBatch(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 256, CommitInterval: time.Hour})
	defer l.Close(ctx)
	first, err := l.Allocate(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	good, err := l.Allocate(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	st := devStatus(t, c)
	if err := l.Free(Extent{Start: st.CapacityBlocks - 1, Len: 1}); err != nil {
		t.Fatal(err)
	}
	var ref *RefusedError
	if err := l.Commit(ctx); !errors.As(err, &ref) || ref.Code != codes.FailedPrecondition {
		t.Fatalf("commit with a free of free space: %v, want FAILED_PRECONDITION", err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatalf("second commit: %v, want the allocation committed", err)
	}
	if n := l.Stats().Lost; n != 0 {
		t.Fatalf("%d allocations lost", n)
	}
	if _, err := c.Free(ctx, first, good); err != nil {
		t.Fatalf("the allocations are not durable: %v", err)
	}
}

// With separate leases (a server without extensions), when a request does
// not fit the newest lease, a new lease is taken, and the older one keeps
// serving the requests that fit its tail instead of handing the tail back
// to the server as a fragment.
func TestOlderLeasesServeRequestsThatFitTheirTails(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 64, WantBlocks: 64, CommitInterval: time.Hour, SeparateLeases: true})
	defer l.Close(ctx)
	a, err := l.Allocate(ctx, 40)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allocate(ctx, 40); err != nil {
		t.Fatal(err)
	}
	if n := l.Stats().Leases; n != 2 {
		t.Fatalf("%d leases, want 2", n)
	}
	tail, err := l.Allocate(ctx, 20)
	if err != nil {
		t.Fatal(err)
	}
	if tail.Start < a.End() || tail.End() > a.Start+64 {
		t.Fatalf("20 blocks at %s, want them from the first lease's tail [%d, %d)", tail, a.End(), a.Start+64)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// When the server can grant only small leases, its free space is in short
// runs that only per-call allocation fills well: requests that no lease
// serves go per call for a while instead of taking more small leases.
func TestFragmentedDeviceAllocatesPerCallInsteadOfLeasing(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	fragment(t, c, 16)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 8, WantBlocks: 64, CommitInterval: time.Hour})
	defer l.Close(ctx)
	var got []Extent
	for range 4 {
		e, err := l.Allocate(ctx, 8)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	if st := l.Stats(); st.Leases != 1 || st.LocalAllocations != 2 || st.RemoteAllocations != 2 {
		t.Fatalf("stats %+v: want one lease of 16 blocks, then per-call allocations", st)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	disjoint(t, got)
}

// Wake-ups of the background loop for other work (a new lease, renewals)
// send nothing: with a long CommitInterval, allocations wait for the
// caller's Commit and then go out in one RPC per lease.
func TestLeasingBatchesAllocationsUntilTheIntervalOrCommit(t *testing.T) {
	beforeExpiry(t, time.Second, func(t testing.TB) {
		s := startServer(t, serverOpts{size: "64MiB", leaseTTL: "1"})
		c := s.dial(t)
		ctx := ctxT(t)
		st0 := devStatus(t, c)
		// Separate leases: a new lease wakes the loop.
		l := c.NewLeasing(LeaseOptions{MinBlocks: 64, WantBlocks: 64, CommitInterval: time.Hour, SeparateLeases: true})
		defer l.Close(ctx)
		var got []Extent
		// 40 + 40 blocks: the second takes a second lease.
		for _, n := range []uint64{40, 40, 8, 8} {
			e, err := l.Allocate(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, e)
		}
		if n := l.Stats().Leases; n != 2 {
			t.Fatalf("%d leases, want 2", n)
		}
		// Renewals every third of the one-second TTL keep both leases alive
		// across several TTLs, and commit nothing.
		time.Sleep(2500 * time.Millisecond)
		if st := devStatus(t, c); st.Leases != 2 || st.UsedBlocks != st0.UsedBlocks {
			t.Fatalf("after renewals: %v; want 2 live leases and nothing committed", st)
		}
		if n := l.Stats().CommitCalls; n != 0 {
			t.Fatalf("%d commit calls before the interval or a Commit, want 0", n)
		}
		if err := l.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if n := l.Stats().CommitCalls; n != 2 {
			t.Fatalf("%d commit calls, want one per lease", n)
		}
		if st := devStatus(t, c); st.UsedBlocks != st0.UsedBlocks+sumExtents(got) {
			t.Fatalf("after Commit: used %d, want %d", st.UsedBlocks, st0.UsedBlocks+sumExtents(got))
		}
	})
}

// Nobody calls Commit: the background loop commits once CommitInterval has
// passed since the first allocation of the batch, the later ones with it.
func TestLeasingCommitsABatchWhenTheIntervalHasPassed(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	st0 := devStatus(t, c)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 256, CommitInterval: 300 * time.Millisecond})
	defer l.Close(ctx)
	var got []Extent
	for range 20 {
		e, err := l.Allocate(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	eventually(t, 10*time.Second, "the batch was not committed", func() bool {
		return devStatus(t, c).UsedBlocks == st0.UsedBlocks+sumExtents(got)
	})
	if n := l.Stats().CommitCalls; n != 1 {
		t.Fatalf("%d commit calls for one batch, want 1", n)
	}
}

// A recalled lease is committed and given back at once, not when the
// CommitInterval ends.
func TestLeasingCommitsAndReleasesARecalledLeaseAtOnce(t *testing.T) {
	beforeExpiry(t, time.Second, func(t testing.TB) {
		s := startServer(t, serverOpts{size: "64MiB", leaseTTL: "1"})
		c := s.dial(t)
		ctx := ctxT(t)
		st0 := devStatus(t, c)
		l := c.NewLeasing(LeaseOptions{MinBlocks: 256, CommitInterval: time.Hour})
		defer l.Close(ctx)
		e, err := l.Allocate(ctx, 5)
		if err != nil {
			t.Fatal(err)
		}
		startRecall(t, ctx, c)
		eventually(t, 10*time.Second, "the recalled lease was not committed and released", func() bool {
			st := devStatus(t, c)
			return st.Leases == 0 && st.UsedBlocks == st0.UsedBlocks+e.Len
		})
		if n := l.Stats().Lost; n != 0 {
			t.Fatalf("%d allocations lost", n)
		}
	})
}

// A leasing client's commits, of allocations and of frees, go on its
// connection's Calls stream, not as unary calls.
func TestLeasingCommitsOnTheCallsStream(t *testing.T) {
	s := startServer(t, serverOpts{size: "256MiB"})
	c, n := dialCounted(t, s.addr, Options{})
	ctx := ctxT(t)
	st0 := devStatus(t, c)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 1024, CommitInterval: time.Hour})
	var got []Extent
	for i := range 20 {
		e, err := l.Allocate(ctx, uint64(1+i))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
		if err := l.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if st := devStatus(t, c); st.UsedBlocks != st0.UsedBlocks+sumExtents(got) {
		t.Fatalf("after the commits: used %d, want %d", st.UsedBlocks, st0.UsedBlocks+sumExtents(got))
	}
	for _, e := range got {
		if err := l.Free(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st := devStatus(t, c); st.UsedBlocks != st0.UsedBlocks {
		t.Fatalf("after the frees' commit: used %d, want %d", st.UsedBlocks, st0.UsedBlocks)
	}
	if got := l.Stats().CommitCalls; got < 21 {
		t.Fatalf("%d commit calls, want at least 21", got)
	}
	onOneStream(t, n)
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
