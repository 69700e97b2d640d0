package blockalloc

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// A request the serving lease cannot hold extends that lease: the lease id
// stays, the server counts one lease with more unused space, and one
// Release gives all of it back.
func TestLeasingExtendsItsLeaseInsteadOfTakingAnother(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	st0 := devStatus(t, c)
	// 24 blocks left after the first allocation are above the low-water
	// mark (MinBlocks): the second allocation is what grows the lease.
	l := c.NewLeasing(LeaseOptions{MinBlocks: 16, WantBlocks: 64, CommitInterval: time.Hour})
	a, err := l.Allocate(ctx, 40)
	if err != nil {
		t.Fatal(err)
	}
	ids := l.LeaseIDs()
	st1 := devStatus(t, c)
	b, err := l.Allocate(ctx, 40)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.LeaseIDs(); !slices.Equal(got, ids) || len(ids) != 1 {
		t.Fatalf("leases %v after growing, want %v", got, ids)
	}
	if st := l.Stats(); st.Leases != 1 || st.Extensions == 0 || st.RemoteAllocations != 0 {
		t.Fatalf("stats %+v: want one lease, extended", st)
	}
	if st := devStatus(t, c); st.Leases != 1 || st.LeasedUnusedBlocks <= st1.LeasedUnusedBlocks {
		t.Fatalf("after growing: %v; want one lease with more than %d leased blocks", st, st1.LeasedUnusedBlocks)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st := devStatus(t, c)
	if st.UsedBlocks != st0.UsedBlocks+a.Len+b.Len || st.Leases != 0 || st.LeasedUnusedBlocks != 0 {
		t.Fatalf("after Close: %v; want the 80 allocated blocks used and no lease", st)
	}
	if _, err := c.Free(ctx, a, b); err != nil {
		t.Fatalf("the allocations are not durable: %v", err)
	}
}

// Below its low-water mark the serving lease grows in the background,
// before an allocation has to wait for it.
func TestLeasingGrowsALowLeaseInTheBackground(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 64, WantBlocks: 256, CommitInterval: time.Hour})
	defer l.Close(ctx)
	if _, err := l.Allocate(ctx, 200); err != nil {
		t.Fatal(err)
	}
	ids := l.LeaseIDs()
	eventually(t, 10*time.Second, "the lease did not grow", func() bool {
		return l.Stats().Extensions == 1 && devStatus(t, c).LeasedUnusedBlocks == 512
	})
	// Served by the extension; 56 + 56 free blocks are left, above the
	// mark, so the lease does not grow again.
	if _, err := l.Allocate(ctx, 200); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Leases != 1 || st.Extensions != 1 || st.LocalAllocations != 2 || !slices.Equal(l.LeaseIDs(), ids) {
		t.Fatalf("stats %+v, leases %v: want both allocations served by lease %v grown once", st, l.LeaseIDs(), ids)
	}
	// Growing is no reason to commit before the interval.
	if n := l.Stats().CommitCalls; n != 0 {
		t.Fatalf("%d commit calls, want none before the interval or a Commit", n)
	}
}

// Committed objects freed through the Leasing come back into its lease:
// the next allocation reuses them locally, with no new grant.
func TestLeasingReusesCommittedFreesLocally(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	st0 := devStatus(t, c)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 16, WantBlocks: 1024, CommitInterval: time.Hour})
	defer l.Close(ctx)
	a, err := l.Allocate(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Free(a); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := l.Stats().RecycledBlocks; n != a.Len {
		t.Fatalf("%d blocks recycled, want the %d freed", n, a.Len)
	}
	if st := devStatus(t, c); st.UsedBlocks != st0.UsedBlocks || st.LeasedUnusedBlocks != 1024 {
		t.Fatalf("after the free: %v; want nothing used and the freed blocks back in the lease", st)
	}
	b, err := l.Allocate(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Leases != 1 || st.Extensions != 0 || st.LocalAllocations != 2 || b != a {
		t.Fatalf("reallocated %s (stats %+v), want %s again from the same lease, no grant", b, st, a)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Free(ctx, b); err != nil {
		t.Fatalf("the reallocation is not durable: %v", err)
	}
}

// loseRecycleReply passes calls through, but loses the reply of the first
// commit that recycles frees after it is armed: the server applied it,
// and the client sees the call cut off (UNKNOWN: outcome unknown). A
// unary commit fails; on a Calls stream, the stream fails when that reply
// arrives.
type loseRecycleReply struct {
	pb.AllocatorClient
	armed atomic.Bool
	unary atomic.Int64 // unary Commit calls
}

func (x *loseRecycleReply) Commit(ctx context.Context, in *pb.CommitRequest, opts ...grpc.CallOption) (*pb.CommitResponse, error) {
	x.unary.Add(1)
	r, err := x.AllocatorClient.Commit(ctx, in, opts...)
	if err == nil && in.RecycleFrees && x.armed.CompareAndSwap(true, false) {
		return nil, status.Error(codes.Unknown, "reply lost")
	}
	return r, err
}

func (x *loseRecycleReply) Calls(ctx context.Context, opts ...grpc.CallOption) (callStreamClient, error) {
	st, err := x.AllocatorClient.Calls(ctx, opts...)
	if err != nil {
		return nil, err
	}
	return &loseRecycleStream{callStreamClient: st, x: x, recycling: map[uint64]bool{}}, nil
}

// loseRecycleStream is a Calls stream of loseRecycleReply.
type loseRecycleStream struct {
	callStreamClient
	x         *loseRecycleReply
	mu        sync.Mutex
	recycling map[uint64]bool // ids of the commits sent that recycle frees
}

func (s *loseRecycleStream) Send(r *pb.CallRequest) error {
	if c := r.GetCommit(); c != nil && c.RecycleFrees {
		s.mu.Lock()
		s.recycling[r.Id] = true
		s.mu.Unlock()
	}
	return s.callStreamClient.Send(r)
}

func (s *loseRecycleStream) Recv() (*pb.CallReply, error) {
	r, err := s.callStreamClient.Recv()
	if err != nil || r.GetCommit() == nil {
		return r, err
	}
	s.mu.Lock()
	recycles := s.recycling[r.Id]
	s.mu.Unlock()
	if recycles && s.x.armed.CompareAndSwap(true, false) {
		return nil, status.Error(codes.Unknown, "reply lost")
	}
	return r, nil
}

// The resend of a commit whose reply was lost is answered with the same
// recycled blocks: they are added to the lease once, whether the commits
// go on the Calls stream or unary.
func TestLeasingAddsTheRecycledBlocksOfAResentCommitOnce(t *testing.T) {
	for _, unary := range []bool{false, true} {
		t.Run(map[bool]string{false: "stream", true: "unary"}[unary], func(t *testing.T) {
			resentCommitRecyclesOnce(t, unary)
		})
	}
}

func resentCommitRecyclesOnce(t *testing.T, unary bool) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	lossy := &loseRecycleReply{AllocatorClient: c.rpc}
	c.rpc = lossy
	c.calls.close()
	c.calls = newCalls(lossy)
	c.calls.unsupported = unary
	l := c.NewLeasing(LeaseOptions{MinBlocks: 16, WantBlocks: 1024, CommitInterval: time.Hour})
	defer l.Close(ctx)
	a, err := l.Allocate(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	lossy.armed.Store(true)
	if err := l.Free(a); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(ctx); !errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("commit with its reply lost: %v, want ErrOutcomeUnknown", err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatalf("resent commit: %v", err)
	}
	if n := l.Stats().RecycledBlocks; n != a.Len {
		t.Fatalf("%d blocks recycled, want %d", n, a.Len)
	}
	l.mu.Lock()
	free := l.leases[0].engine.free
	verr := l.leases[0].engine.verify()
	l.mu.Unlock()
	if verr != nil {
		t.Fatal(verr)
	}
	if st := devStatus(t, c); free != st.LeasedUnusedBlocks || free != 1024 {
		t.Fatalf("%d blocks free in the local engine, the server leases %d unused; want 1024 both", free, st.LeasedUnusedBlocks)
	}
	if n := lossy.unary.Load(); (n == 0) == unary {
		t.Fatalf("%d unary commits with unary calls %v", n, unary)
	}
}

// servingRegion is the space the serving lease has taken in so far, merged.
func servingRegion(l *Leasing) []Extent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.leases[0].engine.region)
}

// commitAndFree commits l's batch and frees es per call: both succeed
// only when es are durable allocations.
func commitAndFree(t *testing.T, ctx context.Context, c *Client, l *Leasing, es ...Extent) {
	t.Helper()
	if err := l.Commit(ctx); err != nil {
		t.Fatalf("commit of %v: %v", es, err)
	}
	if _, err := c.Free(ctx, es...); err != nil {
		t.Fatalf("%v are not durable: %v", es, err)
	}
}

// The extension of a lease may touch the grant's unused tail; an
// allocation cut across that edge is one allocation to the server, and
// commits.
func TestLeasingCommitsAnAllocationSpanningAGrantAndItsExtension(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 16, WantBlocks: 64, CommitInterval: time.Hour})
	defer l.Close(ctx)
	a, err := l.Allocate(ctx, 40)
	if err != nil {
		t.Fatal(err)
	}
	grant := servingRegion(l)
	if len(grant) != 1 || grant[0].End() != a.End()+24 {
		t.Fatalf("granted %v for %s, want one extent with 24 blocks after it", grant, a)
	}
	b, err := l.Allocate(ctx, 40)
	if err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Extensions != 1 || st.Leases != 1 {
		t.Fatalf("stats %+v: want the one lease, extended once", st)
	}
	edge := grant[0].End()
	if b.Start >= edge || b.End() <= edge {
		t.Fatalf("allocated %s (lease now %v): want it across the grant's end %d", b, servingRegion(l), edge)
	}
	commitAndFree(t, ctx, c, l, a, b)
}

// Recycled blocks merge with the free run they touch; an allocation that
// spans both commits.
func TestLeasingCommitsAnAllocationSpanningRecycledBlocksAndTheRunTheyTouch(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 16, WantBlocks: 1024, CommitInterval: time.Hour})
	defer l.Close(ctx)
	a, err := l.Allocate(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Free(a); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := l.Stats().RecycledBlocks; n != a.Len {
		t.Fatalf("%d blocks recycled, want the %d freed", n, a.Len)
	}
	// 1010 blocks fit only across the end of the recycled piece, into the
	// 24 blocks the grant had left after it.
	b, err := l.Allocate(ctx, 1010)
	if err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Extensions != 0 || st.Leases != 1 || st.LocalAllocations != 2 {
		t.Fatalf("stats %+v: want both allocations served by the first grant", st)
	}
	if b.Start != a.Start || b.End() <= a.End() {
		t.Fatalf("allocated %s, want it from %d across the recycled piece's end %d", b, a.Start, a.End())
	}
	commitAndFree(t, ctx, c, l, b)
}

// The fragments a lease's engine holds (holes left by recycled frees, the
// short tail of its run) reach the server in commits and renewals: with a
// second lease live, the server keeps twice the half out of that lease's
// reach, which is all of them, for per-call allocation, as its
// grantable_blocks shows.
func TestLeasingReportsTheFragmentsOfItsLease(t *testing.T) {
	beforeExpiry(t, time.Second, func(t testing.TB) {
		s := startServer(t, serverOpts{size: "256MiB", leaseTTL: "1"})
		c := s.dial(t)
		ctx := ctxT(t)
		other, err := c.rpc.Lease(ctx, &pb.LeaseRequest{ClientId: "raw", MinBlocks: 64, WantBlocks: 256})
		if err != nil {
			t.Fatal(err)
		}
		l := c.NewLeasing(LeaseOptions{MinBlocks: 64, WantBlocks: 4096, CommitInterval: time.Hour})
		defer l.Close(ctx)
		var got []Extent
		for range 48 {
			e, err := l.Allocate(ctx, 64)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, e)
		}
		if err := l.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(got); i += 2 {
			if err := l.Free(got[i]); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		l.mu.Lock()
		fragments := l.leases[0].engine.fragments
		l.mu.Unlock()
		// 8 objects of 64 blocks per lease + 1 is the end without fragments.
		const base = 8 * 64 * 3
		if fragments < 24*64 || fragments <= base {
			t.Fatalf("the lease holds %d blocks of fragments, want the 24 holes of 64 and more than %d", fragments, base)
		}
		var kept uint64
		eventually(t, 10*time.Second, "the server never counted the lease's fragments", func() bool {
			r, err := c.rpc.Renew(ctx, &pb.RenewRequest{LeaseId: other.LeaseId})
			if err != nil {
				t.Fatal(err)
			}
			kept = devStatus(t, c).FreeBlocks - r.GrantableBlocks
			return kept == fragments
		})
	})
}
