package blockalloc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// noSpaceOf fails the test unless err is a *NoSpaceError that matches
// ErrNoSpace, and returns it.
func noSpaceOf(t testing.TB, what string, err error) *NoSpaceError {
	t.Helper()
	var ns *NoSpaceError
	if !errors.As(err, &ns) || !errors.Is(err, ErrNoSpace) {
		t.Fatalf("%s: %v (%T), want a *NoSpaceError matching ErrNoSpace", what, err, err)
	}
	if !strings.HasPrefix(err.Error(), "no space: ") || strings.HasPrefix(ns.Reason, "no space") {
		t.Fatalf("%s: message %q, reason %q: want \"no space: REASON\"", what, err.Error(), ns.Reason)
	}
	return ns
}

// checkDetails fails the test unless d describes the refusal of an object
// of n blocks by the idle device whose status is st.
func checkDetails(t testing.TB, what string, d *pb.NoSpaceDetails, n uint64, st *DeviceStatus) {
	t.Helper()
	if d == nil {
		t.Fatalf("%s: no details", what)
	}
	if d.RequestedBlocks != n {
		t.Errorf("%s: requested_blocks %d, want %d", what, d.RequestedBlocks, n)
	}
	if d.CapacityBlocks != st.CapacityBlocks {
		t.Errorf("%s: capacity_blocks %d, Status says %d", what, d.CapacityBlocks, st.CapacityBlocks)
	}
	if d.LargestFreeExtent >= d.RequestedBlocks {
		t.Errorf("%s: largest_free_extent %d, not shorter than the %d requested", what, d.LargestFreeExtent, d.RequestedBlocks)
	}
	if d.LargestFreeExtent != st.LargestFreeExtent {
		t.Errorf("%s: largest_free_extent %d, Status says %d", what, d.LargestFreeExtent, st.LargestFreeExtent)
	}
	if sum := d.UsedBlocks + d.FreeBlocks + d.LeasedUnusedBlocks; sum != d.CapacityBlocks {
		t.Errorf("%s: used %d + free %d + leased unused %d = %d, want capacity %d",
			what, d.UsedBlocks, d.FreeBlocks, d.LeasedUnusedBlocks, sum, d.CapacityBlocks)
	}
	if d.FreeBlocks != st.FreeBlocks || d.UsedBlocks != st.UsedBlocks || d.LeasedUnusedBlocks != st.LeasedUnusedBlocks {
		t.Errorf("%s: free %d, used %d, leased unused %d; Status of the idle device says %d, %d, %d",
			what, d.FreeBlocks, d.UsedBlocks, d.LeasedUnusedBlocks, st.FreeBlocks, st.UsedBlocks, st.LeasedUnusedBlocks)
	}
}

// unaryContext makes the client's calls go unary: the Calls stream does not
// carry a call's own metadata.
func unaryContext(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-request-id", "no-space")
}

// A per-call Allocate that no free run can hold, although the device has
// more free blocks than it asks, is refused with the device's state, on
// the Calls stream and as a unary call alike.
func TestNoSpaceCallCarriesTheDeviceOnTheStreamAndUnary(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c, n := dialCounted(t, s.addr, Options{})
	ctx := ctxT(t)
	fragment(t, c, 8)
	st := devStatus(t, c)
	const want = 20
	if st.LargestFreeExtent != 8 || st.FreeBlocks < want {
		t.Fatalf("fragmented device: largest free run %d, %d free; want runs of 8 and at least %d free",
			st.LargestFreeExtent, st.FreeBlocks, want)
	}

	unary, streams := n.unary.Load(), n.streams.Load()
	_, err := c.Allocate(ctx, want)
	if u := n.unary.Load(); u != unary {
		t.Fatalf("the call went unary (%d unary calls, %d before)", u, unary)
	}
	ns := noSpaceOf(t, "on the stream", err)
	checkDetails(t, "on the stream", ns.Details, want, st)

	_, err = c.Allocate(unaryContext(ctx), want)
	if u := n.unary.Load(); u != unary+1 {
		t.Fatalf("%d unary calls, %d before: the call with metadata did not go unary", u, unary)
	}
	ns = noSpaceOf(t, "unary", err)
	checkDetails(t, "unary", ns.Details, want, st)

	// A scattered object needs its blocks, in any runs: more than are free.
	big := st.FreeBlocks + 1
	_, err = c.AllocateScattered(ctx, big)
	ns = noSpaceOf(t, "scattered", err)
	if d := ns.Details; d == nil || d.RequestedBlocks != big || d.FreeBlocks != st.FreeBlocks ||
		d.CapacityBlocks != st.CapacityBlocks {
		t.Errorf("scattered %d blocks: details %v, want %d requested, %d free, capacity %d",
			big, d, big, st.FreeBlocks, st.CapacityBlocks)
	}

	if after := devStatus(t, c); after.UsedBlocks != st.UsedBlocks || after.FreeBlocks != st.FreeBlocks {
		t.Errorf("the refusals changed the device: used %d free %d, before %d %d",
			after.UsedBlocks, after.FreeBlocks, st.UsedBlocks, st.FreeBlocks)
	}
	if s := n.streams.Load(); s != streams {
		t.Errorf("%d Calls streams, %d before: the refusals ended the stream", s, streams)
	}
}

// quotaServer serves a new device for one tenant whose quota is 64 KiB, and
// returns its token.
func quotaServer(t *testing.T) (*testServer, string) {
	t.Helper()
	dir := t.TempDir()
	tok := "bat_go-test-token-quota"
	sum := sha256.Sum256([]byte(tok))
	h := hex.EncodeToString(sum[:])
	cfg := filepath.Join(dir, "serve.toml")
	text := fmt.Sprintf("[[tenant]]\nname = \"q\"\ntoken_sha256 = %q\nquota_bytes = 65536\n", h)
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, serverOpts{size: "64MiB", device: filepath.Join(dir, "dev0"), extra: []string{"--config", cfg}})
	return s, tok
}

// A refusal for a tenant's quota is a *QuotaError (ErrQuota, not
// ErrNoSpace) that names the quota: on the stream, unary, and through a
// leasing allocator (its grant and its per-call fallback).
func TestQuotaRefusalIsReportedAsQuotaNotNoSpace(t *testing.T) {
	s, tok := quotaServer(t)
	c := dialAs(t, s, tok)
	ctx := ctxT(t)
	st := devStatus(t, c)
	over := 65536/st.BlockSize + 1
	check := func(what string, err error) {
		t.Helper()
		var q *QuotaError
		if !errors.Is(err, ErrQuota) || errors.Is(err, ErrNoSpace) || !errors.As(err, &q) {
			t.Fatalf("%s: %v (%T), want a *QuotaError, not no space", what, err, err)
		}
		d := q.Details
		if d.GetTenant() != "q" || d.GetDevice() != st.Name || d.GetQuotaBytes() != 65536 ||
			d.GetHeldBytes() != 0 || d.GetAskedBytes() != over*st.BlockSize {
			t.Fatalf("%s: details %v", what, d)
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "over quota: ") ||
			!strings.Contains(msg, "tenant q") || !strings.Contains(msg, "65536") {
			t.Fatalf("%s: message %q", what, msg)
		}
	}
	for _, call := range []struct {
		what string
		ctx  context.Context
	}{{"on the stream", ctx}, {"unary", unaryContext(ctx)}} {
		_, err := c.Allocate(call.ctx, over)
		check(call.what, err)
	}
	l := c.NewLeasing(LeaseOptions{MinBlocks: 1, CommitInterval: time.Hour})
	_, err := l.Allocate(ctx, over)
	check("leased", err)
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, 1); err != nil {
		t.Fatalf("an allocation within the quota: %v", err)
	}
}

// The details of a CallError become the error's, as a unary call's status
// details do; a refusal without them has none.
func TestCallErrorWithNoSpaceDetails(t *testing.T) {
	ctx := context.Background()
	at := &pb.NoSpaceDetails{
		RequestedBlocks: 1024, FreeBlocks: 30000, LargestFreeExtent: 1003,
		UsedBlocks: 4164304, LeasedUnusedBlocks: 0, CapacityBlocks: 4194304,
	}
	msg := "no space: 1024 blocks requested, 30000 blocks free, largest free extent 1003 blocks"
	reason := strings.TrimPrefix(msg, "no space: ")

	err := callError(ctx, 7, &pb.CallError{Code: int32(codes.ResourceExhausted), Message: msg, NoSpace: at})
	ns := noSpaceOf(t, "stream reply with details", err)
	if ns.Reason != reason || err.Error() != msg {
		t.Errorf("reason %q, message %q; want %q, %q", ns.Reason, err.Error(), reason, msg)
	}
	if !proto.Equal(ns.Details, at) {
		t.Errorf("details %v, want %v", ns.Details, at)
	}

	// The same refusal made unary, in the status details.
	rich, werr := status.New(codes.ResourceExhausted, msg).WithDetails(at)
	if werr != nil {
		t.Fatal(werr)
	}
	err = statusError(ctx, rich.Err())
	ns = noSpaceOf(t, "unary status with details", err)
	if ns.Reason != reason || !proto.Equal(ns.Details, at) {
		t.Errorf("unary: reason %q details %v; want %q %v", ns.Reason, ns.Details, reason, at)
	}

	err = callError(ctx, 8, &pb.CallError{Code: int32(codes.ResourceExhausted), Message: "quota exceeded"})
	if ns := noSpaceOf(t, "stream reply without details", err); ns.Details != nil || ns.Reason != "quota exceeded" {
		t.Errorf("without details: reason %q details %v; want \"quota exceeded\" and none", ns.Reason, ns.Details)
	}
	// Status details of another type are not no-space details.
	other, werr := status.New(codes.ResourceExhausted, "limit").WithDetails(&pb.Extent{Start: 1, Len: 2})
	if werr != nil {
		t.Fatal(werr)
	}
	if ns := noSpaceOf(t, "unary status with other details", statusError(ctx, other.Err())); ns.Details != nil {
		t.Errorf("other details taken for no-space details: %v", ns.Details)
	}

	// Details on another code are ignored; code OK is a bad reply.
	var ref *RefusedError
	err = callError(ctx, 9, &pb.CallError{Code: int32(codes.FailedPrecondition), Message: "busy", NoSpace: at})
	if !errors.As(err, &ref) || ref.Code != codes.FailedPrecondition || errors.Is(err, ErrNoSpace) {
		t.Errorf("FAILED_PRECONDITION with details: %v, want a *RefusedError", err)
	}
	if err := callError(ctx, 10, &pb.CallError{Code: 0, Message: "fine"}); !errors.Is(err, ErrBadReply) {
		t.Errorf("code OK: %v, want ErrBadReply", err)
	}
}

// noSpaceFake refuses every Allocate with RESOURCE_EXHAUSTED, unary and on
// its Calls stream, by the object's size: 1 with NoSpaceDetails, 2 with
// none, 3 with status details of another type only.
type noSpaceFake struct {
	unaryServer
}

var fakeDetails = &pb.NoSpaceDetails{
	RequestedBlocks: 1, FreeBlocks: 0, LargestFreeExtent: 0, UsedBlocks: 100, CapacityBlocks: 100,
}

func (f *noSpaceFake) refusal(blocks uint64) *status.Status {
	s := status.New(codes.ResourceExhausted, fmt.Sprintf("no space: fake refusal %d", blocks))
	var err error
	switch blocks {
	case 1:
		s, err = s.WithDetails(fakeDetails)
	case 3:
		s, err = s.WithDetails(&pb.Extent{Start: 3, Len: 3})
	}
	if err != nil {
		return status.New(codes.Internal, err.Error())
	}
	return s
}

func (f *noSpaceFake) Allocate(_ context.Context, r *pb.AllocateRequest) (*pb.AllocateResponse, error) {
	return nil, f.refusal(r.GetBlocks()).Err()
}

func (f *noSpaceFake) Calls(st grpc.BidiStreamingServer[pb.CallRequest, pb.CallReply]) error {
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		blocks := req.GetAllocate().GetBlocks()
		e := &pb.CallError{Code: int32(codes.ResourceExhausted), Message: f.refusal(blocks).Message()}
		if blocks == 1 {
			e.NoSpace = fakeDetails
		}
		if err := st.Send(&pb.CallReply{Id: req.Id, Result: &pb.CallReply_Error{Error: e}}); err != nil {
			return err
		}
	}
}

// Refusals over the wire, with and without details, on the stream and
// unary: the details are the server's, or nil.
func TestNoSpaceCallDetailsOverTheWire(t *testing.T) {
	c, n := dialCounted(t, serveGo(t, &noSpaceFake{}), Options{})
	ctx := ctxT(t)
	for _, path := range []struct {
		what string
		ctx  context.Context
	}{{"stream", ctx}, {"unary", unaryContext(ctx)}} {
		for blocks := uint64(1); blocks <= 3; blocks++ {
			what := fmt.Sprintf("%s, Allocate(%d)", path.what, blocks)
			_, err := c.Allocate(path.ctx, blocks)
			ns := noSpaceOf(t, what, err)
			if want := fmt.Sprintf("fake refusal %d", blocks); ns.Reason != want {
				t.Errorf("%s: reason %q, want %q", what, ns.Reason, want)
			}
			switch {
			case blocks == 1 && !proto.Equal(ns.Details, fakeDetails):
				t.Errorf("%s: details %v, want %v", what, ns.Details, fakeDetails)
			case blocks != 1 && ns.Details != nil:
				t.Errorf("%s: details %v, want none", what, ns.Details)
			}
		}
	}
	if u, s := n.unary.Load(), n.streams.Load(); u != 3 || s != 1 {
		t.Fatalf("%d unary calls and %d Calls streams; want 3 and 1", u, s)
	}
}

// The leasing allocator, after a refused grant, allocates per call, gives
// its lease back and tries again: the error it reports is the server's
// last refusal, details and all.
func TestLeasingReportsTheServersNoSpaceRefusal(t *testing.T) {
	beforeExpiry(t, 2*time.Second, func(t testing.TB) {
		s := startServer(t, serverOpts{size: "64MiB", leaseTTL: "2"})
		c := s.dial(t)
		ctx := ctxT(t)
		fragment(t, c, 8)
		l := c.NewLeasing(LeaseOptions{MinBlocks: 8, WantBlocks: 8, CommitInterval: time.Hour})
		defer l.Close(ctx)
		small, err := l.Allocate(ctx, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.LeaseIDs()) != 1 {
			t.Fatalf("leases %v, want one", l.LeaseIDs())
		}
		const want = 20
		_, err = l.Allocate(ctx, want)
		ns := noSpaceOf(t, "leasing", err)
		if len(l.LeaseIDs()) != 0 {
			t.Errorf("leases %v still held after no space", l.LeaseIDs())
		}
		if err := l.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		st := devStatus(t, c)
		checkDetails(t, "leasing", ns.Details, want, st)
		if _, err := c.Free(ctx, small); err != nil {
			t.Fatalf("the allocation in the lease is not committed: %v", err)
		}
	})
}

// The adapter passes the server's refusal on, per call and leased, from
// AllocateContinuousBlocks and from TryAllocateBlocks on a full device.
func TestAdapterReportsTheServersNoSpaceRefusal(t *testing.T) {
	for _, lease := range []bool{false, true} {
		t.Run(fmt.Sprintf("lease=%v", lease), func(t *testing.T) {
			s := startServer(t, serverOpts{size: "64MiB", leaseTTL: "2"})
			c := s.dial(t)
			fragment(t, c, 8)
			a, err := NewAdapter(c, AdapterOptions{Lease: lease, LeaseOptions: LeaseOptions{MinBlocks: 8, WantBlocks: 8}})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Shutdown()
			st := devStatus(t, c)
			_, _, err = a.AllocateContinuousBlocks(20)
			checkDetails(t, "AllocateContinuousBlocks", noSpaceOf(t, "AllocateContinuousBlocks", err).Details, 20, st)

			// Fill the runs of 8: no free block is left.
			ctx := ctxT(t)
			for batch := uint32(512); batch > 0; {
				if _, err := c.AllocateMany(ctx, batch, 8, nil); errors.Is(err, ErrNoSpace) {
					batch /= 2
				} else if err != nil {
					t.Fatal(err)
				}
			}
			st = devStatus(t, c)
			if st.FreeBlocks != 0 {
				t.Fatalf("%d blocks still free", st.FreeBlocks)
			}
			_, _, err = a.TryAllocateBlocks(3)
			d := noSpaceOf(t, "TryAllocateBlocks", err).Details
			checkDetails(t, "TryAllocateBlocks", d, 3, st)
		})
	}
}
