package blockalloc

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// fakeServer is an Allocator in the test process, for what the real server
// cannot be made to do on cue: lose a reply after running a call, answer
// as a stale owner of the device, answer a grant late. It keeps request
// ids as the schema says (a resent id gets the first result, replayed),
// grants leases of one region each, and accepts every commit. Its Calls
// stream runs each call as the unary method would; a call whose hook says
// so ends the stream with the hook's error after it ran, without a reply.
type fakeServer struct {
	pb.UnimplementedAllocatorServer

	mu sync.Mutex
	// epoch is what replies carry.
	epoch uint64
	// ttlMs and marginMs are what lease replies carry.
	ttlMs, marginMs uint64
	// leaseDelay is how long Lease waits before it replies.
	leaseDelay time.Duration
	// lost, when set, is asked after each Allocate, Free or Commit ran (and
	// before each Renew)
	// (method name, its receipt count for that method from 1): an error
	// is sent instead of the reply (on the Calls stream it ends the
	// stream), as if the reply were lost.
	lost func(method string, n int) error
	// stale, when set, is asked before each reply: a nonzero epoch to put
	// in it instead of epoch.
	stale func(method string, n int) uint64

	next     uint64 // next block to hand out
	leases   uint64 // leases granted
	byID     map[uint64]proto.Message
	received map[string][]proto.Message // requests by method name, in order
	at       map[string][]time.Time     // when each was received
	ran      map[string]int             // calls that ran (replays not counted)
}

func newFakeServer() *fakeServer {
	return &fakeServer{
		epoch: 7, ttlMs: 60_000, marginMs: 1000, next: 1 << 20,
		byID:     make(map[uint64]proto.Message),
		received: make(map[string][]proto.Message),
		at:       make(map[string][]time.Time),
		ran:      make(map[string]int),
	}
}

// serve serves f on a loopback port until the test ends; its address.
func (f *fakeServer) serve(t *testing.T) string {
	t.Helper()
	return serveGo(t, f)
}

// receive records a request (l.mu held); its receipt count.
func (f *fakeServer) receive(method string, req proto.Message) int {
	f.received[method] = append(f.received[method], proto.Clone(req))
	f.at[method] = append(f.at[method], time.Now())
	return len(f.received[method])
}

// requests are the requests of method received so far.
func (f *fakeServer) requests(method string) []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]proto.Message(nil), f.received[method]...)
}

// receivedAt are the receipt times of method's requests.
func (f *fakeServer) receivedAt(method string) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.at[method]...)
}

func (f *fakeServer) runs(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ran[method]
}

// replyEpoch is the epoch of the reply to the n-th call of method (l.mu held).
func (f *fakeServer) replyEpoch(method string, n int) uint64 {
	if f.stale != nil {
		if e := f.stale(method, n); e != 0 {
			return e
		}
	}
	return f.epoch
}

// after is the hook's error for the n-th call of method, which ran (l.mu held).
func (f *fakeServer) after(method string, n int) error {
	if f.lost == nil {
		return nil
	}
	return f.lost(method, n)
}

func (f *fakeServer) Allocate(_ context.Context, r *pb.AllocateRequest) (*pb.AllocateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.receive("Allocate", r)
	if first, ok := f.byID[r.RequestId]; ok && r.RequestId != 0 {
		out := proto.Clone(first).(*pb.AllocateResponse)
		out.Replayed = true
		out.Epoch = f.replyEpoch("Allocate", n)
		return out, nil
	}
	f.ran["Allocate"]++
	out := &pb.AllocateResponse{BlockSize: 4096}
	for range r.Count {
		b := r.GetBlocks()
		out.Objects = append(out.Objects, &pb.Object{Extents: []*pb.Extent{{Start: f.next, Len: b}}})
		f.next += b
	}
	if r.RequestId != 0 {
		f.byID[r.RequestId] = proto.Clone(out)
	}
	if err := f.after("Allocate", n); err != nil {
		return nil, err
	}
	out.Epoch = f.replyEpoch("Allocate", n)
	return out, nil
}

func (f *fakeServer) Free(_ context.Context, r *pb.FreeRequest) (*pb.FreeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.receive("Free", r)
	if first, ok := f.byID[r.RequestId]; ok && r.RequestId != 0 {
		out := proto.Clone(first).(*pb.FreeResponse)
		out.Replayed = true
		out.Epoch = f.replyEpoch("Free", n)
		return out, nil
	}
	f.ran["Free"]++
	out := &pb.FreeResponse{Blocks: sumLen(extentsOf(r.Extents))}
	if r.RequestId != 0 {
		f.byID[r.RequestId] = proto.Clone(out)
	}
	if err := f.after("Free", n); err != nil {
		return nil, err
	}
	out.Epoch = f.replyEpoch("Free", n)
	return out, nil
}

func extentsOf(es []*pb.Extent) []Extent {
	out := make([]Extent, len(es))
	for i, e := range es {
		out[i] = Extent{Start: e.Start, Len: e.Len}
	}
	return out
}

func (f *fakeServer) Status(_ context.Context, r *pb.StatusRequest) (*pb.StatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.receive("Status", r)
	return &pb.StatusResponse{Devices: []*pb.DeviceStatus{{
		Name: "fake", BlockSize: 4096, CapacityBlocks: 1 << 40, Epoch: f.replyEpoch("Status", n),
	}}}, nil
}

// Lease grants a new region of MinBlocks blocks (an extension grows the
// lease by as many), after leaseDelay.
func (f *fakeServer) Lease(_ context.Context, r *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	f.mu.Lock()
	n := f.receive("Lease", r)
	delay := f.leaseDelay
	f.mu.Unlock()
	time.Sleep(delay)
	f.mu.Lock()
	defer f.mu.Unlock()
	id := r.ExtendLeaseId
	if id == 0 {
		f.leases++
		id = f.leases
	}
	e := &pb.Extent{Start: f.next, Len: r.MinBlocks}
	f.next += r.MinBlocks
	return &pb.LeaseResponse{
		LeaseId: id, Extents: []*pb.Extent{e}, TtlMs: f.ttlMs, MarginMs: f.marginMs,
		CapacityBlocks: 1 << 40, Epoch: f.replyEpoch("Lease", n),
	}, nil
}

func (f *fakeServer) Commit(_ context.Context, r *pb.CommitRequest) (*pb.CommitResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.receive("Commit", r)
	f.ran["Commit"]++
	if err := f.after("Commit", n); err != nil {
		return nil, err
	}
	return &pb.CommitResponse{TtlMs: f.ttlMs, MarginMs: f.marginMs, Epoch: f.replyEpoch("Commit", n)}, nil
}

func (f *fakeServer) Renew(_ context.Context, r *pb.RenewRequest) (*pb.RenewResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.receive("Renew", r)
	if err := f.after("Renew", n); err != nil {
		return nil, err
	}
	return &pb.RenewResponse{TtlMs: f.ttlMs, MarginMs: f.marginMs, Epoch: f.replyEpoch("Renew", n)}, nil
}

func (f *fakeServer) Release(_ context.Context, r *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.receive("Release", r)
	return &pb.ReleaseResponse{Epoch: f.replyEpoch("Release", n)}, nil
}

// Calls runs each call as its unary method; an error of the lost hook ends
// the stream without the reply.
func (f *fakeServer) Calls(st grpc.BidiStreamingServer[pb.CallRequest, pb.CallReply]) error {
	if err := st.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	ctx := st.Context()
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		reply := &pb.CallReply{Id: req.Id}
		switch c := req.Call.(type) {
		case *pb.CallRequest_Allocate:
			r, err := f.Allocate(ctx, c.Allocate)
			if err != nil {
				return err
			}
			reply.Result = &pb.CallReply_Allocate{Allocate: r}
		case *pb.CallRequest_Free:
			r, err := f.Free(ctx, c.Free)
			if err != nil {
				return err
			}
			reply.Result = &pb.CallReply_Free{Free: r}
		case *pb.CallRequest_Commit:
			r, err := f.Commit(ctx, c.Commit)
			if err != nil {
				return err
			}
			reply.Result = &pb.CallReply_Commit{Commit: r}
		default:
			return status.Error(codes.InvalidArgument, "no call")
		}
		if err := st.Send(reply); err != nil {
			return err
		}
	}
}
