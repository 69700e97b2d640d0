package blockalloc

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// rpcCounts counts a client's unary Allocate, Free and Commit calls and
// the Calls streams it opens.
type rpcCounts struct {
	unary   atomic.Int64
	streams atomic.Int64
}

func (n *rpcCounts) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption,
		) error {
			switch method {
			case pb.Allocator_Allocate_FullMethodName, pb.Allocator_Free_FullMethodName,
				pb.Allocator_Commit_FullMethodName:
				n.unary.Add(1)
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc,
			cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption,
		) (grpc.ClientStream, error) {
			if method == pb.Allocator_Calls_FullMethodName {
				n.streams.Add(1)
			}
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// dialCounted dials addr with opts and counts the client's calls.
func dialCounted(t testing.TB, addr string, opts Options) (*Client, *rpcCounts) {
	t.Helper()
	n := &rpcCounts{}
	opts.DialOptions = append(opts.DialOptions, n.dialOptions()...)
	c, err := Dial(addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, n
}

// onOneStream fails the test unless every Allocate, Free and Commit of the
// client went over a single Calls stream.
func onOneStream(t testing.TB, n *rpcCounts) {
	t.Helper()
	if u, s := n.unary.Load(), n.streams.Load(); u != 0 || s != 1 {
		t.Fatalf("%d unary Allocate/Free/Commit calls and %d Calls streams; want none and one", u, s)
	}
}

func sumLen(es []Extent) uint64 {
	var sum uint64
	for _, e := range es {
		sum += e.Len
	}
	return sum
}

func TestConcurrentCallsShareOneStream(t *testing.T) {
	s := startServer(t, serverOpts{size: "256MiB"})
	c, n := dialCounted(t, s.addr, Options{})
	ctx := ctxT(t)
	const goroutines, calls = 32, 40
	var (
		mu   sync.Mutex
		kept []Extent
		wg   sync.WaitGroup
		errs = make(chan error, goroutines)
	)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var mine []Extent
			for i := range calls {
				e, err := c.Allocate(ctx, 1+uint64(rng.IntN(64)))
				if err != nil {
					errs <- err
					return
				}
				// Every other object is freed at once, while the others
				// allocate: its blocks may be handed out again.
				if i%2 == 1 {
					if freed, err := c.Free(ctx, e); err != nil || freed != e.Len {
						errs <- errors.Join(err, errors.New("free returned a wrong count"))
						return
					}
					continue
				}
				mine = append(mine, e)
			}
			mu.Lock()
			kept = append(kept, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(kept) != goroutines*calls/2 {
		t.Fatalf("%d objects kept, want %d", len(kept), goroutines*calls/2)
	}
	disjoint(t, kept)
	st := devStatus(t, c)
	if st.UsedBlocks != st.MetaBlocks+sumLen(kept) {
		t.Fatalf("used %d blocks, want meta %d + kept %d", st.UsedBlocks, st.MetaBlocks, sumLen(kept))
	}
	onOneStream(t, n)
}

// A server stopped gracefully answers every call it got: the calls it ran
// with their results, the calls it read after the stop began (and the
// calls sent elsewhere after its stop notice) as unavailable, which did
// not run; none is cut off with its outcome unknown, and the device holds
// exactly the allocations that returned after a restart.
func TestConcurrentCallsDuringAGracefulStopAllReturn(t *testing.T) {
	// The server runs at most 4 calls of a stream at once and reads no
	// more until one is answered: with 16 goroutines calling, some calls
	// are always sent and not read when it stops.
	s := startServer(t, serverOpts{size: "256MiB", extra: []string{"--max-streams-per-connection", "4"}})
	// Each call sent once: the test is about how the stop answers them.
	c, n := dialCounted(t, s.addr, Options{RetryFor: NoRetry})
	ctx := ctxT(t)
	if _, err := c.Free(ctx, mustAllocate(t, c, 1)); err != nil {
		t.Fatal(err)
	}
	const goroutines = 16
	var (
		mu     sync.Mutex
		ok     []Extent
		failed []error
		wg     sync.WaitGroup
	)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			for {
				e, err := c.Allocate(ctx, 1+uint64(rng.IntN(16)))
				mu.Lock()
				if err != nil {
					failed = append(failed, err)
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
	eventually(t, 20*time.Second, "300 allocations before the stop", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ok) >= 300
	})
	if u, st := n.unary.Load(), n.streams.Load(); u != 0 || st != 1 {
		t.Fatalf("%d unary calls and %d Calls streams before the stop; want none and one", u, st)
	}
	s.stop()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("calls still waiting 20 s after the server stopped")
	}
	if len(failed) != goroutines {
		t.Fatalf("%d calls failed, want one a goroutine (%d)", len(failed), goroutines)
	}
	refused := 0
	for _, err := range failed {
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("a call during the stop: %v, want ErrUnavailable (did not run)", err)
		}
		if strings.Contains(err.Error(), "stopping") {
			refused++
		}
	}
	// The calls sent and not read when the stop began (most of the
	// goroutines' at any time) are read on and refused.
	if refused == 0 {
		t.Fatalf("no call was refused by the stopping server: %v", failed)
	}
	disjoint(t, ok)
	s.restart()
	st := devStatus(t, s.dial(t))
	if st.UsedBlocks != st.MetaBlocks+sumLen(ok) {
		t.Fatalf("after the restart: used %d blocks, want meta %d + the %d allocations that returned (%d blocks)",
			st.UsedBlocks, st.MetaBlocks, len(ok), sumLen(ok))
	}
}

func mustAllocate(t testing.TB, c *Client, n uint64) Extent {
	t.Helper()
	e, err := c.Allocate(ctxT(t), n)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// A caller whose context ends while it waits for its reply returns at once
// with the context's error; the reply that comes later is dropped, and the
// stream goes on.
func TestCancelledCallStopsWaitingOnTheStream(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c, n := dialCounted(t, s.addr, Options{})
	mustAllocate(t, c, 1)
	// A stopped server reads nothing: the call waits until its context
	// ends.
	s.signal(t, syscall.SIGSTOP)
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			s.signal(t, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	ctx, cancel := context.WithCancel(ctxT(t))
	time.AfterFunc(200*time.Millisecond, cancel)
	returned := make(chan error, 1)
	go func() {
		_, err := c.Allocate(ctx, 2)
		returned <- err
	}()
	select {
	case err := <-returned:
		// Sent, and the server runs it: not unavailable.
		if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrUnavailable) {
			t.Fatalf("a cancelled call: %v, want context.Canceled and ErrOutcomeUnknown", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled call still waits 10 s later")
	}
	if w := waitingCalls(c); w != 0 {
		t.Fatalf("%d calls still registered as waiting after the cancelled one returned", w)
	}
	resume()
	// The server runs the cancelled call when it resumes; its reply finds
	// no caller, and the next calls get their own replies.
	if e := mustAllocate(t, c, 3); e.Len != 3 {
		t.Fatalf("the call after a cancelled one: %s, want 3 blocks", e)
	}
	onOneStream(t, n)
}

func waitingCalls(c *Client) int {
	c.calls.mu.Lock()
	s := c.calls.stream
	c.calls.mu.Unlock()
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

func TestCloseEndsTheCallStream(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	// Clients of other tests may still be closing theirs.
	before := callGoroutines()
	c, n := dialCounted(t, s.addr, Options{})
	mustAllocate(t, c, 1)
	onOneStream(t, n)
	if g := callGoroutines(); g < 2 {
		t.Fatalf("%d goroutines serve Calls streams with one open; want its sender and receiver", g)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if g := callGoroutines(); g > before {
		t.Fatalf("%d goroutines serve Calls streams after Close, %d before the client: its stream's still run", g, before)
	}
	if _, err := c.Allocate(ctxT(t), 1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Allocate after Close: %v, want ErrUnavailable", err)
	}
	if s := n.streams.Load(); s != 1 {
		t.Fatalf("%d Calls streams opened; a closed client opens none", s)
	}
}

// callGoroutines counts the goroutines serving Calls streams, in the whole
// test binary.
func callGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		m := runtime.Stack(buf, true)
		if m < len(buf) {
			buf = buf[:m]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), "(*callStream).send(") + strings.Count(string(buf), "(*callStream).receive(")
}

// unaryServer has unary Allocate and Free and no Calls method, as a server
// older than the stream.
type unaryServer struct {
	pb.UnimplementedAllocatorServer
	mu   sync.Mutex
	next uint64
}

func (u *unaryServer) Allocate(_ context.Context, r *pb.AllocateRequest) (*pb.AllocateResponse, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := &pb.AllocateResponse{}
	for range r.Count {
		n := r.GetBlocks()
		out.Objects = append(out.Objects, &pb.Object{Extents: []*pb.Extent{{Start: u.next, Len: n}}})
		u.next += n
	}
	return out, nil
}

func (u *unaryServer) Free(_ context.Context, r *pb.FreeRequest) (*pb.FreeResponse, error) {
	var n uint64
	for _, e := range r.Extents {
		n += e.Len
	}
	return &pb.FreeResponse{Blocks: n}, nil
}

// serveGo serves srv on a loopback port until the test ends; its address.
func serveGo(t *testing.T, srv pb.AllocatorServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterAllocatorServer(g, srv)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

func TestServerWithoutCallsIsAskedOnceThenUnary(t *testing.T) {
	c, n := dialCounted(t, serveGo(t, &unaryServer{}), Options{})
	ctx := ctxT(t)
	var got []Extent
	for i := range 5 {
		e, err := c.Allocate(ctx, uint64(1+i))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	disjoint(t, got)
	if freed, err := c.Free(ctx, got...); err != nil || freed != sumLen(got) {
		t.Fatalf("Free: %d blocks, %v; want %d", freed, err, sumLen(got))
	}
	if u, s := n.unary.Load(), n.streams.Load(); u != 6 || s != 1 {
		t.Fatalf("%d unary calls and %d Calls streams; want 6 unary calls and one stream asked for", u, s)
	}
}

// oddCalls answers Allocate calls on its Calls stream by their size: 1 an
// error with code OK, 2 a Free reply, 3 a reply with no result, 4 first a
// reply to another id and then the right one, 5 RESOURCE_EXHAUSTED.
type oddCalls struct {
	unaryServer
}

func (o *oddCalls) Calls(st grpc.BidiStreamingServer[pb.CallRequest, pb.CallReply]) error {
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		r := &pb.CallReply{Id: req.Id}
		switch req.GetAllocate().GetBlocks() {
		case 1:
			r.Result = &pb.CallReply_Error{Error: &pb.CallError{Code: 0, Message: "fine"}}
		case 2:
			r.Result = &pb.CallReply_Free{Free: &pb.FreeResponse{Blocks: 2}}
		case 4:
			if err := st.Send(&pb.CallReply{Id: req.Id + 1000, Result: &pb.CallReply_Free{Free: &pb.FreeResponse{}}}); err != nil {
				return err
			}
			r.Result = &pb.CallReply_Allocate{Allocate: &pb.AllocateResponse{
				Objects: []*pb.Object{{Extents: []*pb.Extent{{Start: 8, Len: 4}}}},
			}}
		case 5:
			r.Result = &pb.CallReply_Error{Error: &pb.CallError{Code: 8, Message: "no space: device full"}}
		}
		if err := st.Send(r); err != nil {
			return err
		}
	}
}

func TestOddCallRepliesAreBadReplies(t *testing.T) {
	c, n := dialCounted(t, serveGo(t, &oddCalls{}), Options{})
	ctx := ctxT(t)
	for _, size := range []uint64{1, 2, 3} {
		if _, err := c.Allocate(ctx, size); !errors.Is(err, ErrBadReply) {
			t.Errorf("Allocate(%d): %v, want ErrBadReply", size, err)
		}
	}
	if e, err := c.Allocate(ctx, 4); err != nil || e != (Extent{Start: 8, Len: 4}) {
		t.Errorf("Allocate(4) after a reply to another id: %s %v, want [8, 12)", e, err)
	}
	var ns *NoSpaceError
	if _, err := c.Allocate(ctx, 5); !errors.Is(err, ErrNoSpace) || !errors.As(err, &ns) || ns.Details != nil {
		t.Errorf("Allocate(5): %v, want a *NoSpaceError without details", err)
	}
	onOneStream(t, n)
}

// The stream carries the metadata of its opening: a call with metadata of
// its own goes unary, where the server sees it.
func TestCallWithItsOwnMetadataGoesUnary(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c, n := dialCounted(t, s.addr, Options{})
	e := mustAllocate(t, c, 1)
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "x-request-id", "42")
	if _, err := c.Free(ctx, e); err != nil {
		t.Fatal(err)
	}
	if u, st := n.unary.Load(), n.streams.Load(); u != 1 || st != 1 {
		t.Fatalf("%d unary calls and %d Calls streams; want the call with metadata unary and one stream", u, st)
	}
}

// cutOffServer is an Allocator whose Calls stream reads one call and then
// ends as end says, without its reply, and whose unary Allocate fails with
// code: calls cut off after they were sent.
type cutOffServer struct {
	pb.UnimplementedAllocatorServer
	end  func() error
	code codes.Code
}

func (x *cutOffServer) Calls(st pb.Allocator_CallsServer) error {
	if err := st.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	if _, err := st.Recv(); err != nil {
		return err
	}
	return x.end()
}

func (x *cutOffServer) Allocate(context.Context, *pb.AllocateRequest) (*pb.AllocateResponse, error) {
	return nil, status.Error(x.code, "cut off")
}

// A call cut off after it was sent (the stream ended without its reply,
// or failed; a unary call answered CANCELLED or UNKNOWN) used to fail as
// unavailable, which says that it did not run; it may have. Now it fails
// with ErrOutcomeUnknown.
func TestACallCutOffAfterItWasSentIsOutcomeUnknown(t *testing.T) {
	cases := []struct {
		name  string
		end   func() error
		code  codes.Code
		unary bool
	}{
		{name: "stream ends without the reply", end: func() error { return nil }},
		{name: "stream fails UNKNOWN", end: func() error { return status.Error(codes.Unknown, "broken") }},
		{name: "stream fails CANCELLED", end: func() error { return status.Error(codes.Canceled, "timeout") }},
		{name: "unary CANCELLED", code: codes.Canceled, unary: true},
		{name: "unary UNKNOWN", code: codes.Unknown, unary: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			pb.RegisterAllocatorServer(srv, &cutOffServer{end: tc.end, code: tc.code})
			go func() { _ = srv.Serve(ln) }()
			defer srv.Stop()
			c, err := Dial(ln.Addr().String(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tc.unary {
				c.calls.mu.Lock()
				c.calls.unsupported = true
				c.calls.mu.Unlock()
			}
			_, err = c.Allocate(ctxT(t), 1)
			if !errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrUnavailable) {
				t.Fatalf("%v, want ErrOutcomeUnknown and not ErrUnavailable", err)
			}
		})
	}
}
