package blockalloc

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// idleLeasing starts a server whose leases live 60 s (a renewal is 20 s
// away) and a Leasing over it that commits only when asked; the Leasing is
// closed when the test ends.
func idleLeasing(t *testing.T) (*testServer, *Client, *Leasing, context.Context) {
	t.Helper()
	s := startServer(t, serverOpts{size: "64MiB", leaseTTL: "60"})
	c := s.dial(t)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 256, CommitInterval: time.Hour})
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return s, c, l, ctxT(t)
}

// leaseAndCommit makes l hold a lease with one committed allocation of n
// blocks and nothing pending: an idle client.
func leaseAndCommit(t *testing.T, ctx context.Context, l *Leasing, n uint64) Extent {
	t.Helper()
	e, err := l.Allocate(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if len(l.LeaseIDs()) != 1 {
		t.Fatalf("leases %v, want one", l.LeaseIDs())
	}
	return e
}

// startRecall starts a recall of every lease on c's server as a real
// shortage does: a per-call allocation of more than the unleased free
// space, which a lease taken here (and released once the recall runs)
// would make up. The recall lasts one TTL.
func startRecall(t testing.TB, ctx context.Context, c *Client) {
	t.Helper()
	held, err := c.rpc.Lease(ctx, &pb.LeaseRequest{ClientId: "other", MinBlocks: 16, WantBlocks: 16})
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	w, err := c.rpc.WatchRecalls(wctx, &pb.WatchRecallsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	free := devStatus(t, c).FreeBlocks
	// An allocation that waits for the leases. It is not cancelled (a call
	// the client gave up on could still run once the lease is back, before
	// the server notices): once the recall runs, the lease goes back and
	// the allocation is awaited, then freed.
	type result struct {
		r   *pb.AllocateResponse
		err error
	}
	short := make(chan result, 1)
	go func() {
		r, err := c.rpc.Allocate(ctx, &pb.AllocateRequest{Count: 1, Size: &pb.AllocateRequest_Blocks{Blocks: free + 1}})
		short <- result{r, err}
	}()
	for {
		e, err := w.Recv()
		if err != nil {
			t.Fatalf("waiting for the recall: %v", err)
		}
		if e.Recall {
			break
		}
	}
	stop()
	if _, err := c.rpc.Release(ctx, &pb.ReleaseRequest{LeaseId: held.LeaseId}); err != nil {
		t.Fatalf("release: %v", err)
	}
	got := <-short
	switch {
	case got.err == nil:
		var extents []*pb.Extent
		for _, o := range got.r.Objects {
			extents = append(extents, o.Extents...)
		}
		if _, err := c.rpc.Free(ctx, &pb.FreeRequest{Extents: extents}); err != nil {
			t.Fatalf("freeing the waiting allocation: %v", err)
		}
	case status.Code(got.err) != codes.ResourceExhausted:
		// Not within the space the leases gave back is the only other end.
		t.Fatalf("the waiting allocation: %v", got.err)
	}
}

// An idle client (nothing to commit, its next renewal 20 s away) learns of
// a recall from the WatchRecalls stream and hands its lease back at once.
func TestIdleLeasingGivesBackItsLeaseAsSoonAsARecallStarts(t *testing.T) {
	s, c, l, ctx := idleLeasing(t)
	st0 := devStatus(t, c)
	e := leaseAndCommit(t, ctx, l, 5)
	if st := devStatus(t, c); st.Leases != 1 || st.LeasedUnusedBlocks == 0 {
		t.Fatalf("before the recall: %v; want one lease with unused blocks", st)
	}
	startRecall(t, ctx, s.dial(t))
	eventually(t, 10*time.Second, "the idle client kept its lease through a recall", func() bool {
		st := devStatus(t, c)
		return st.Leases == 0 && st.LeasedUnusedBlocks == 0 && len(l.LeaseIDs()) == 0
	})
	if st := devStatus(t, c); st.UsedBlocks != st0.UsedBlocks+e.Len {
		t.Fatalf("after the recall: used %d, want %d", st.UsedBlocks, st0.UsedBlocks+e.Len)
	}
	if n := l.Stats().Lost; n != 0 {
		t.Fatalf("%d allocations lost", n)
	}
}

// The stream ends when the server stops; the watcher opens it again and
// learns of a recall on the restarted server (the first message of the
// new stream says one is running).
func TestRecallWatcherReopensItsStreamAfterAServerRestart(t *testing.T) {
	s, _, l, ctx := idleLeasing(t)
	leaseAndCommit(t, ctx, l, 5)
	s.kill()
	s.restart()
	// The restarted server has forgotten the lease; only a recall (or the
	// renewal, 20 s away) makes the client hand it back and drop it.
	startRecall(t, ctx, s.dial(t))
	eventually(t, 10*time.Second, "the recall on the restarted server did not reach the client", func() bool {
		return len(l.LeaseIDs()) == 0
	})
}

// goroutinesOf counts the goroutines running the method fn of l: a
// traceback names each frame's receiver.
func goroutinesOf(l *Leasing, fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), fmt.Sprintf("/clients/go.(*Leasing).%s(%p", fn, l))
}

// Close stops the recall watcher with the rest: its stream is cancelled and
// no goroutine of the Leasing is left.
func TestCloseStopsTheRecallWatcher(t *testing.T) {
	_, c, l, ctx := idleLeasing(t)
	leaseAndCommit(t, ctx, l, 5)
	fns := []string{"watchRecalls", "background"}
	for _, fn := range fns {
		if n := goroutinesOf(l, fn); n != 1 {
			t.Fatalf("%d goroutines in %s, want 1", n, fn)
		}
	}
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Close(closeCtx); err != nil {
		t.Fatalf("Close with the watcher running: %v", err)
	}
	select {
	case <-l.watchDone:
	default:
		t.Fatal("Close returned before the recall watcher stopped")
	}
	eventually(t, 5*time.Second, "goroutines of the Leasing are left after Close", func() bool {
		for _, fn := range append(fns, "followRecalls") {
			if goroutinesOf(l, fn) > 0 {
				return false
			}
		}
		return true
	})
	if st := devStatus(t, c); st.Leases != 0 {
		t.Fatalf("after Close: %v; want no lease", st)
	}
}

// olderServer passes calls through, but sends WatchRecalls under a method
// name the server does not know: what a server without the call answers.
type olderServer struct {
	pb.AllocatorClient
	conn  *grpc.ClientConn
	calls atomic.Int32
}

func (x *olderServer) WatchRecalls(ctx context.Context, in *pb.WatchRecallsRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[pb.RecallEvent], error) {
	x.calls.Add(1)
	desc := &grpc.StreamDesc{ServerStreams: true}
	s, err := x.conn.NewStream(ctx, desc, "/blockalloc.v1.Allocator/NoSuchWatch", opts...)
	if err != nil {
		return nil, err
	}
	cs := &grpc.GenericClientStream[pb.WatchRecallsRequest, pb.RecallEvent]{ClientStream: s}
	if err := cs.SendMsg(in); err != nil {
		return nil, err
	}
	if err := cs.CloseSend(); err != nil {
		return nil, err
	}
	return cs, nil
}

// Against a server without WatchRecalls the watcher stops after one try
// instead of retrying every second; the Leasing works on.
func TestRecallWatcherStopsOnAServerWithoutTheCall(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	older := &olderServer{AllocatorClient: c.rpc, conn: c.conn}
	c.rpc = older
	l := c.NewLeasing(LeaseOptions{MinBlocks: 256, CommitInterval: time.Hour})
	defer l.Close(ctx)
	select {
	case <-l.watchDone:
	case <-time.After(10 * time.Second):
		t.Fatalf("the recall watcher still runs after %d tries on a server without the call", older.calls.Load())
	}
	if n := older.calls.Load(); n != 1 {
		t.Fatalf("%d tries, want 1", n)
	}
	leaseAndCommit(t, ctx, l, 5)
}
