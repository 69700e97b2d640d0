package blockalloc

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// dialFake dials a fake server with opts; unary makes every Allocate and
// Free go unary (as against a server without the Calls stream).
func dialFake(t *testing.T, f *fakeServer, opts Options, unary bool) *Client {
	t.Helper()
	c, err := Dial(f.serve(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if unary {
		c.calls.mu.Lock()
		c.calls.unsupported = true
		c.calls.mu.Unlock()
	}
	return c
}

func allocateRequests(f *fakeServer) []*pb.AllocateRequest {
	var out []*pb.AllocateRequest
	for _, m := range f.requests("Allocate") {
		out = append(out, m.(*pb.AllocateRequest))
	}
	return out
}

// A call whose reply was lost after it ran (the connection broke, the
// stream failed, the server answered UNAVAILABLE or DEADLINE_EXCEEDED) is
// sent again with the same request id, and the server's replay of the
// first result is the call's result: one allocation, not two, and no
// error. It used to fail (ErrOutcomeUnknown or ErrUnavailable), with no id
// that would have let it be sent again.
func TestCallWhoseReplyWasLostIsResentWithTheSameRequestID(t *testing.T) {
	cases := []struct {
		name  string
		unary bool
		err   error
	}{
		{name: "stream broken", err: status.Error(codes.Unavailable, "connection lost")},
		{name: "stream ended", err: status.Error(codes.Unknown, "stream reset")},
		{name: "unary DEADLINE_EXCEEDED", unary: true, err: status.Error(codes.DeadlineExceeded, "too slow")},
		{name: "unary UNAVAILABLE", unary: true, err: status.Error(codes.Unavailable, "stopping")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeServer()
			lose := map[string]int{"Allocate": 1, "Free": 1}
			f.lost = func(method string, n int) error {
				if lose[method] == n {
					return tc.err
				}
				return nil
			}
			c := dialFake(t, f, Options{}, tc.unary)
			ctx := ctxT(t)
			// The server's epoch says that it keeps request ids.
			if _, err := c.Status(ctx); err != nil {
				t.Fatal(err)
			}
			e, err := c.Allocate(ctx, 3)
			if err != nil {
				t.Fatalf("Allocate with its first reply lost: %v", err)
			}
			reqs := allocateRequests(f)
			if len(reqs) != 2 || reqs[0].RequestId == 0 || reqs[0].RequestId != reqs[1].RequestId {
				t.Fatalf("%d Allocate requests with ids %v; want two with the same nonzero id", len(reqs), ids(reqs))
			}
			if f.runs("Allocate") != 1 || e != (Extent{Start: 1 << 20, Len: 3}) {
				t.Fatalf("Allocate: %s after %d runs; want the first run's [1048576, 1048579) and one run", e, f.runs("Allocate"))
			}
			if freed, err := c.Free(ctx, e); err != nil || freed != 3 {
				t.Fatalf("Free with its first reply lost: %d blocks, %v", freed, err)
			}
			frees := f.requests("Free")
			if len(frees) != 2 || f.runs("Free") != 1 ||
				frees[0].(*pb.FreeRequest).RequestId != frees[1].(*pb.FreeRequest).RequestId {
				t.Fatalf("%d Free requests, %d runs; want two with the same id and one run", len(frees), f.runs("Free"))
			}
		})
	}
}

func ids(reqs []*pb.AllocateRequest) []uint64 {
	out := make([]uint64, len(reqs))
	for i, r := range reqs {
		out[i] = r.RequestId
	}
	return out
}

// A server without epochs (an older one) may not keep request ids: a call
// cut off after it was sent is not sent again (it could run twice), and
// fails with ErrOutcomeUnknown as before.
func TestCallCutOffIsNotResentToAServerWithoutEpochs(t *testing.T) {
	f := newFakeServer()
	f.epoch = 0
	f.lost = func(string, int) error { return status.Error(codes.Unavailable, "connection lost") }
	c := dialFake(t, f, Options{}, false)
	_, err := c.Allocate(ctxT(t), 3)
	if !errors.Is(err, ErrOutcomeUnknown) || len(f.requests("Allocate")) != 1 {
		t.Fatalf("%v after %d requests; want ErrOutcomeUnknown after one", err, len(f.requests("Allocate")))
	}
}

// Request ids are never 0, count up within a client, and start at a
// random point per client.
func TestRequestIDsCountUpFromARandomStart(t *testing.T) {
	f := newFakeServer()
	addr := f.serve(t)
	var firsts []uint64
	for range 2 {
		c, err := Dial(addr, Options{})
		if err != nil {
			t.Fatal(err)
		}
		before := len(allocateRequests(f))
		for range 3 {
			if _, err := c.Allocate(ctxT(t), 1); err != nil {
				t.Fatal(err)
			}
		}
		_ = c.Close()
		got := ids(allocateRequests(f)[before:])
		for i, id := range got {
			if id == 0 || id != got[0]+uint64(i) {
				t.Fatalf("request ids %v; want nonzero ids counting up", got)
			}
		}
		firsts = append(firsts, got[0])
	}
	if firsts[0] == firsts[1] {
		t.Fatalf("two clients both started at request id %d", firsts[0])
	}
}

// Every request carries the newest epoch of the device seen in any reply.
func TestRequestsCarryTheNewestEpochSeen(t *testing.T) {
	f := newFakeServer()
	c := dialFake(t, f, Options{}, false)
	ctx := ctxT(t)
	e := mustAllocate(t, c, 1)
	f.mu.Lock()
	f.epoch = 9
	f.mu.Unlock()
	if _, err := c.Status(ctx); err != nil {
		t.Fatal(err)
	}
	mustAllocate(t, c, 1)
	if _, err := c.Free(ctx, e); err != nil {
		t.Fatal(err)
	}
	got := []uint64{}
	for _, r := range allocateRequests(f) {
		got = append(got, r.Epoch)
	}
	if free := f.requests("Free")[0].(*pb.FreeRequest); !slices.Equal(got, []uint64{0, 9}) || free.Epoch != 9 || c.Epoch() != 9 {
		t.Fatalf("Allocate epochs %v, Free epoch %d, client epoch %d; want [0 9], 9, 9", got, free.Epoch, c.Epoch())
	}
}

// A reply with an older epoch than one seen for the device comes from a
// stale owner: it is refused (ErrFenced, with ErrUnavailable), and sent
// again like an unavailable call; so is the server's own refusal as a
// fenced owner. They used to be taken as they came.
func TestReplyOfAnOlderEpochIsFenced(t *testing.T) {
	f := newFakeServer()
	f.stale = func(method string, n int) uint64 {
		if method == "Allocate" && n == 2 {
			return 3
		}
		return 0
	}
	once := dialFake(t, f, Options{RetryFor: NoRetry}, false)
	mustAllocate(t, once, 1)
	_, err := once.Allocate(ctxT(t), 1)
	if !errors.Is(err, ErrFenced) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a reply of epoch 3 after epoch 7: %v, want ErrFenced and ErrUnavailable", err)
	}

	f = newFakeServer()
	f.stale = func(method string, n int) uint64 {
		if method == "Allocate" && n == 2 {
			return 3
		}
		return 0
	}
	c := dialFake(t, f, Options{}, false)
	mustAllocate(t, c, 1)
	if _, err := c.Allocate(ctxT(t), 1); err != nil {
		t.Fatalf("a call answered by a stale owner, sent again: %v", err)
	}
	if reqs := allocateRequests(f); len(reqs) != 3 || reqs[1].RequestId != reqs[2].RequestId {
		t.Fatalf("%d Allocate requests with ids %v; want the fenced one sent again with its id", len(reqs), ids(reqs))
	}

	f = newFakeServer()
	f.lost = func(method string, n int) error {
		return status.Error(codes.Unavailable, "fenced: the request's epoch 9 is newer than the device's 7")
	}
	fenced := dialFake(t, f, Options{RetryFor: NoRetry}, true)
	if _, err := fenced.Allocate(ctxT(t), 1); !errors.Is(err, ErrFenced) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a server's fenced refusal: %v, want ErrFenced and ErrUnavailable", err)
	}
}

// A lease's deadline counts from when its request was sent, not from when
// the reply came: ttl - margin after the sending. A commit moves it on
// from its own sending, and a margin of 0 counts as ttl/20. Deadline of a
// committed allocation is false.
func TestLeaseDeadlineCountsFromTheSendingOfItsRequest(t *testing.T) {
	f := newFakeServer()
	f.ttlMs, f.marginMs = 60_000, 1000
	f.leaseDelay = 500 * time.Millisecond
	c := dialFake(t, f, Options{}, false)
	ctx := ctxT(t)
	// Commits only when asked.
	l := c.NewLeasing(LeaseOptions{MinBlocks: 1024, CommitInterval: time.Hour})
	defer l.Close(ctx)
	before := time.Now()
	e, err := l.Allocate(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := l.Deadline(e)
	received := f.receivedAt("Lease")[0]
	if !ok || d.Before(before.Add(59*time.Second)) || d.After(received.Add(59*time.Second)) {
		t.Fatalf("deadline %v after the sending (%v), want 59 s after it, no later than %v after",
			d.Sub(before), ok, received.Sub(before)+59*time.Second)
	}
	f.mu.Lock()
	f.ttlMs, f.marginMs = 120_000, 0
	f.mu.Unlock()
	beforeCommit := time.Now()
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Deadline(e); ok {
		t.Fatal("a committed allocation still has a deadline")
	}
	e2, err := l.Allocate(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	d2, ok := l.Deadline(e2)
	commitAt := f.receivedAt("Commit")
	last := commitAt[len(commitAt)-1]
	// 120 s less a margin of 120 s / 20 = 6 s.
	if !ok || d2.Before(beforeCommit.Add(114*time.Second)) || d2.After(last.Add(114*time.Second)) {
		t.Fatalf("deadline after a commit: %v after its sending (%v), want 114 s", d2.Sub(beforeCommit), ok)
	}
}

// Past its deadline a lease hands out nothing more: the next allocation
// takes a new lease (or goes per call), and what the old lease served is
// still committed.
func TestLeaseServesNothingPastItsDeadline(t *testing.T) {
	f := newFakeServer()
	f.ttlMs, f.marginMs = 3000, 500
	c := dialFake(t, f, Options{}, false)
	ctx := ctxT(t)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 1024})
	defer l.Close(ctx)
	e, err := l.Allocate(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := l.Deadline(e)
	if !ok {
		t.Fatal("no deadline for an uncommitted leased allocation")
	}
	// No renewal or commit moves the deadline meanwhile.
	resume := l.pause()
	time.Sleep(time.Until(d) + 10*time.Millisecond)
	if x, ok := l.TryAllocateLocal(4); ok {
		t.Fatalf("allocated %s from a lease %v past its deadline", x, time.Since(d))
	}
	e2, err := l.Allocate(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	if e2.Start < e.Start+1024 && e2.Start >= e.Start {
		t.Fatalf("allocated %s from the lease of %s, past its deadline", e2, e)
	}
	resume()
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Lost != 0 {
		t.Fatalf("%d allocations lost; the server took the commit", st.Lost)
	}
}

// A commit that cannot reach the server is sent again with its sequence,
// its allocations neither lost nor committed, until the lease's deadline;
// then they are lost. They used to be retried for ever.
func TestCommitUnansweredUntilTheDeadlineIsLost(t *testing.T) {
	f := newFakeServer()
	f.ttlMs, f.marginMs = 3000, 200
	c := dialFake(t, f, Options{}, false)
	ctx := ctxT(t)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 1024})
	defer l.Close(ctx)
	e, err := l.Allocate(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := l.Deadline(e)
	if !ok {
		t.Fatal("no deadline for an uncommitted leased allocation")
	}
	f.mu.Lock()
	// Down: neither commits nor renewals go through.
	f.lost = func(method string, _ int) error {
		if method == "Commit" || method == "Renew" {
			return status.Error(codes.Unavailable, "restarting")
		}
		return nil
	}
	f.mu.Unlock()
	for {
		err := l.Commit(ctx)
		var le *LostError
		if errors.As(err, &le) {
			if time.Now().Before(d) || !slices.Contains(le.Extents, e) {
				t.Fatalf("lost %v at %v before the deadline; want %s lost after it", le.Extents, time.Until(d), e)
			}
			break
		}
		if !errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("a commit that cannot reach the server: %v", err)
		}
		if ctx.Err() != nil {
			t.Fatal("the allocation was never given up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	commits := f.requests("Commit")
	for _, m := range commits {
		if r := m.(*pb.CommitRequest); r.Sequence != 1 || r.LeaseId != 1 {
			t.Fatalf("commit of lease %d sequence %d; want every sending of lease 1 sequence 1", r.LeaseId, r.Sequence)
		}
	}
	if len(commits) < 2 {
		t.Fatalf("%d commits sent; want it sent again", len(commits))
	}
}

// A commit answered by a stale owner (an older epoch than the lease's
// grant carried) is not taken: it is sent again with the same sequence,
// and nothing is lost.
func TestLeasingResendsACommitAnsweredByAStaleOwner(t *testing.T) {
	f := newFakeServer()
	f.stale = func(method string, n int) uint64 {
		if method == "Commit" && n == 1 {
			return 3
		}
		return 0
	}
	c := dialFake(t, f, Options{}, false)
	ctx := ctxT(t)
	// Commits only when asked.
	l := c.NewLeasing(LeaseOptions{MinBlocks: 1024, CommitInterval: time.Hour})
	defer l.Close(ctx)
	e, err := l.Allocate(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(ctx); !errors.Is(err, ErrFenced) {
		t.Fatalf("a commit answered with an older epoch: %v, want ErrFenced", err)
	}
	if _, ok := l.Deadline(e); !ok {
		t.Fatal("an allocation whose commit a stale owner answered counts as committed")
	}
	if err := l.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	commits := f.requests("Commit")
	if len(commits) != 2 || !proto.Equal(commits[0], commits[1]) || commits[0].(*pb.CommitRequest).Epoch != 7 {
		t.Fatalf("commits %v; want the same commit twice, with epoch 7", commits)
	}
	if st := l.Stats(); st.Lost != 0 {
		t.Fatalf("%d allocations lost", st.Lost)
	}
}

// Calls that a SIGKILL of the server cuts off, and calls made while it is
// down, are sent again (with their request ids) once it is back: every
// call returns without error, and the device holds exactly the
// allocations that returned, each once. They used to fail as unavailable
// or with their outcome unknown.
func TestCallsAcrossAServerRestartRunOnceAndSucceed(t *testing.T) {
	s := startServer(t, serverOpts{size: "256MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	st0 := devStatus(t, c)
	var (
		mu   sync.Mutex
		ok   []Extent
		errs []error
		wg   sync.WaitGroup
		stop atomic.Bool
	)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for !stop.Load() {
				e, err := c.Allocate(ctx, 1+uint64(rng.IntN(8)))
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					ok = append(ok, e)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(ok) + len(errs)
	}
	eventually(t, 30*time.Second, "100 allocations before the kill", func() bool { return count() >= 100 })
	s.kill()
	before := count()
	s.restart()
	eventually(t, 30*time.Second, "100 allocations after the restart", func() bool {
		mu.Lock()
		failed := len(errs) > 0
		mu.Unlock()
		return failed || count() >= before+100
	})
	stop.Store(true)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d calls failed across the restart; the first: %v", len(errs), errs[0])
	}
	disjoint(t, ok)
	if st := devStatus(t, c); st.UsedBlocks != st0.UsedBlocks+sumLen(ok) {
		t.Fatalf("used %d blocks, want %d + the %d allocations that returned (%d blocks)",
			st.UsedBlocks, st0.UsedBlocks, len(ok), sumLen(ok))
	}
}
