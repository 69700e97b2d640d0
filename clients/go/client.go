// Package blockalloc is the Go client of the blockalloc allocation service
// (crates/proto/proto/blockalloc/v1/allocator.proto).
//
//   - Client: one connection and the per-call operations (Allocate,
//     AllocateScattered, Free, Status), each durable when it returns.
//   - Leasing: allocation inside leased regions at local speed, with
//     batched background commits, renewals, and lost-allocation reports.
//   - Adapter: the original BlockAllocator interface over either.
//
// Every extent is in blocks of the device's block size (Status().BlockSize).
// Errors match ErrNoSpace, ErrQuota, ErrUnavailable (the call did not run),
// ErrOutcomeUnknown (cut off after it was sent: it may have run), ErrLost,
// ErrFenced, ErrClosed or ErrBadReply with errors.Is, or are a *RefusedError with the server's
// reason. A refusal for want of space is a *NoSpaceError (ErrNoSpace); when
// the device had no free run for the object, its Details say how the
// device stood at the refusal (free blocks, longest free run, used and
// leased blocks, capacity). A refusal for the tenant's quota is a
// *QuotaError (ErrQuota) whose Details name the quota.
//
// The writer's rule. An allocation of a Leasing is durable only once a
// Commit has made it so; until then it belongs to a lease, which the
// server keeps alive only as long as renewals and commits reach it. Each
// lease has a deadline: when the request that last kept it alive (the
// grant, a renewal, a commit) was sent, plus the lease's TTL, minus the
// server's margin (LeaseResponse.margin_ms; a twentieth of the TTL when a
// server sends none). Before the deadline the caller may write object data
// into an uncommitted allocation; from the deadline on it must not (a write
// that may not finish by then commits first: a Commit that returns nil
// makes the space the caller's for good). The server frees an expired
// lease's space only a margin after the expiry, so a client that keeps the
// rule never writes into space someone else holds, whatever pauses,
// network cuts or restarts happened. Leasing.Deadline(extent) is the
// deadline of an uncommitted allocation. Past its deadline a lease serves
// no allocation; what it served is committed, or reported lost (ErrLost)
// when no commit got through by then.
//
// Retries. Every Allocate and Free carries a request id; one that ended
// unavailable, or cut off after it was sent, is sent again with the same
// id (Options.RetryFor), and a server that keeps ids answers it with the
// first call's result. Commits of a lease are sent again with the same
// sequence number until its deadline (a restarted server keeps its
// leases). Every reply carries the device's owner epoch; a reply with an
// older epoch than one seen before comes from a stale owner and is
// refused (ErrFenced, sent again).
package blockalloc

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// Extent is a run of Len blocks from block Start.
type Extent struct {
	Start uint64
	Len   uint64
}

// End is the block just past the extent.
func (e Extent) End() uint64 { return e.Start + e.Len }

func (e Extent) String() string { return fmt.Sprintf("[%d, %d)", e.Start, e.End()) }

func (e Extent) toPB() *pb.Extent { return &pb.Extent{Start: e.Start, Len: e.Len} }

func fromPB(e *pb.Extent) (Extent, error) {
	if e == nil || e.Len == 0 || e.Start > math.MaxUint64-e.Len {
		return Extent{}, badReply("extent %v is empty or wraps", e)
	}
	return Extent{Start: e.Start, Len: e.Len}, nil
}

func toPBs(es []Extent) []*pb.Extent {
	out := make([]*pb.Extent, len(es))
	for i, e := range es {
		out[i] = e.toPB()
	}
	return out
}

// DeviceStatus is the space accounting of one device; see DeviceStatus in
// the schema. used_blocks + leased_unused_blocks + free_blocks ==
// capacity_blocks.
type DeviceStatus = pb.DeviceStatus

// MaxBatch is the server's limit on objects per Allocate and extents per
// Free or Commit.
const MaxBatch = 4096

// Options of Dial.
type Options struct {
	// Device is the server's device to use, by name (its file name); empty
	// with DeviceIndex for a device by position.
	Device string
	// DeviceIndex is the device's position in the server's list, from 0;
	// used when Device is empty.
	DeviceIndex uint32
	// MaxReconnectDelay bounds the wait between attempts to reconnect to a
	// server that went away; 0 means 2 s. While the connection is down,
	// calls fail at once with ErrUnavailable.
	MaxReconnectDelay time.Duration
	// TLS, when set, connects over TLS with this configuration: RootCAs
	// for a server certificate from a private CA, Certificates for servers
	// that require a client certificate, ServerName when addr's host is
	// not the certificate's name. Nil connects in plain text.
	TLS *tls.Config
	// DialOptions are added to the gRPC dial options (after the transport
	// credentials that TLS chooses).
	DialOptions []grpc.DialOption
	// Token is the tenant's bearer token, sent as `authorization: Bearer
	// TOKEN` with every call (a server with tenants requires it); empty
	// sends none. WithToken is the same as a dial option.
	Token string
	// RetryFor bounds how long an Allocate or Free that ended unavailable
	// (no connection, a stopping or fenced server), or cut off after it was
	// sent (a broken connection, DEADLINE_EXCEEDED), is sent again with
	// the same request id, which the server runs once (see Client); 0
	// means DefaultRetryFor, NoRetry (any negative value) sends each call
	// once.
	RetryFor time.Duration
}

// DefaultRetryFor is how long a call is sent again by default (Options.RetryFor).
const DefaultRetryFor = 30 * time.Second

// NoRetry as Options.RetryFor sends each call once.
const NoRetry time.Duration = -1

// The wait before the first resend, doubled after each one up to retryMaxWait.
const (
	retryFirstWait = 10 * time.Millisecond
	retryMaxWait   = time.Second
)

// bearer sends a token with every call.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// The token also goes over plain-text connections: the server decides
// whether it accepts them.
func (b bearer) RequireTransportSecurity() bool { return false }

// WithToken is the dial option that sends token as `authorization: Bearer
// TOKEN` with every call.
func WithToken(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(bearer(token))
}

// Client is a connection to an allocation server. It is safe for many
// goroutines; after a server restart it reconnects by itself.
//
// Every Allocate and Free carries a request id (a random start per Client,
// then counting up). A call that ends unavailable is sent again with the
// same id, with backoff (10 ms doubling to 1 s), for Options.RetryFor; so
// is a call cut off after it was sent, once the server has shown that it
// runs a resent id once (its replies carry the device's epoch): it then
// answers with the first call's result instead of running it twice.
//
// The client keeps the newest epoch of the device it has seen in any
// reply, sends it with every request (a server that is a stale owner of
// the device refuses it), and takes a reply with an older epoch as one
// from a stale owner: ErrFenced (with ErrUnavailable), sent again.
type Client struct {
	conn   *grpc.ClientConn
	rpc    pb.AllocatorClient
	device *pb.DeviceRef
	addr   string
	calls  *calls
	// tls is the client's TLS configuration (nil: plain text), to tell a
	// TLS mistake when the connection fails (see explain).
	tls *tls.Config
	// retryFor bounds resends (Options.RetryFor); 0: none.
	retryFor time.Duration
	// lastRequest is the last request id handed out.
	lastRequest atomic.Uint64
	// epoch is the newest epoch of the device seen in a reply; 0: none.
	epoch atomic.Uint64
	// stop, when set, ends what follows the connection's server (see
	// Cluster.DeviceClient) before Close closes the connection.
	stop func()
}

// Dial makes a client of the server at addr ("host:port"). It does not wait
// for the connection: a server that cannot be reached makes the first call
// fail with ErrUnavailable.
func Dial(addr string, opts Options) (*Client, error) {
	return dial("passthrough:///"+addr, addr, opts)
}

// dial makes a client of target (a gRPC target), with opts and the dial
// options extra added after opts.DialOptions. addr is the server's address
// for Addr and for explaining a failed connection (see explain).
func dial(target, addr string, opts Options, extra ...grpc.DialOption) (*Client, error) {
	delay := opts.MaxReconnectDelay
	if delay <= 0 {
		delay = 2 * time.Second
	}
	bo := backoff.DefaultConfig
	bo.BaseDelay = 50 * time.Millisecond
	bo.MaxDelay = delay
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = credentials.NewTLS(opts.TLS)
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 5 * time.Second}),
	}
	if opts.Token != "" {
		dial = append(dial, WithToken(opts.Token))
	}
	dial = append(dial, opts.DialOptions...)
	dial = append(dial, extra...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("%w: bad address %q: %w", ErrUnavailable, addr, err)
	}
	dev := &pb.DeviceRef{Ref: &pb.DeviceRef_Index{Index: opts.DeviceIndex}}
	if opts.Device != "" {
		dev = &pb.DeviceRef{Ref: &pb.DeviceRef_Name{Name: opts.Device}}
	}
	rpc := pb.NewAllocatorClient(conn)
	c := &Client{conn: conn, rpc: rpc, device: dev, addr: addr, calls: newCalls(rpc), tls: opts.TLS}
	switch {
	case opts.RetryFor == 0:
		c.retryFor = DefaultRetryFor
	case opts.RetryFor > 0:
		c.retryFor = opts.RetryFor
	}
	// Ids of two clients must not meet in the server's window of recent
	// ids: each client starts at a random point of the 64-bit space.
	var seed [8]byte
	_, _ = rand.Read(seed[:]) // never fails (crypto/rand panics instead)
	c.lastRequest.Store(binary.LittleEndian.Uint64(seed[:]))
	return c, nil
}

// requestID is a new request id: never 0 (which asks for no retry
// protection).
func (c *Client) requestID() uint64 {
	for {
		if id := c.lastRequest.Add(1); id != 0 {
			return id
		}
	}
}

// observe notes the device's epoch from a reply: a fenced error when it is
// older than one seen before (the reply came from a stale owner). 0 (a
// server without epochs) says nothing.
func (c *Client) observe(epoch uint64) error {
	for {
		seen := c.epoch.Load()
		switch {
		case epoch == 0 || epoch == seen:
			return nil
		case epoch < seen:
			return fencedReply(epoch, seen)
		case c.epoch.CompareAndSwap(seen, epoch):
			return nil
		}
	}
}

// Epoch is the newest epoch of the device this client has seen in a reply
// (0: none yet, or a server without epochs).
func (c *Client) Epoch() uint64 { return c.epoch.Load() }

// retryable says whether a call that failed with err is sent again: it did
// not run (ErrUnavailable, ErrFenced among them), or it was cut off and the
// server runs a resent request id once; not when ctx ended or the client
// was closed.
func (c *Client) retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, ErrClosed) || c.calls.isClosed() {
		return false
	}
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	// A server that sends epochs keeps request ids: a call that may have
	// run gets its first result when sent again. An older server would run
	// it twice (a second allocation, or a free of blocks allocated since).
	return errors.Is(err, ErrOutcomeUnknown) && c.epoch.Load() != 0
}

// retry runs attempt (one sending of a call, with the same request id each
// time) until it succeeds or fails in a way that sending it again cannot
// help, with backoff, for at most c.retryFor from the first attempt.
func (c *Client) retry(ctx context.Context, attempt func() error) error {
	start := time.Now()
	wait := retryFirstWait
	for n := 0; ; n++ {
		err := attempt()
		if err == nil || !c.retryable(ctx, err) || time.Since(start)+wait > c.retryFor {
			return err
		}
		if n == 0 {
			// A TLS mistake of the client's settings fails every sending:
			// said at once (see explain), not after RetryFor.
			if e := c.explain(ctx, err); e != err {
				return e
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (not sent again: %w)", err, ctx.Err())
		}
		wait = min(2*wait, retryMaxWait)
	}
}

// RPC is the generated gRPC client, for calls this type does not wrap.
func (c *Client) RPC() pb.AllocatorClient { return c.rpc }

// Addr is the server's address as given to Dial.
func (c *Client) Addr() string { return c.addr }

// Close closes the connection and ends its Calls stream; calls in flight
// fail with ErrUnavailable.
func (c *Client) Close() error {
	if c.stop != nil {
		c.stop()
	}
	c.calls.close()
	return c.conn.Close()
}

// allocate makes an Allocate call on the connection's Calls stream, or
// unary when the stream cannot take it, sent again as retry says; mk makes
// the request of each sending (a request handed to a stream is not
// touched again) with the call's request id and the newest epoch seen.
func (c *Client) allocate(ctx context.Context, mk func(id, epoch uint64) *pb.AllocateRequest) (*pb.AllocateResponse, error) {
	id := c.requestID()
	var r *pb.AllocateResponse
	err := c.retry(ctx, func() (err error) {
		req := mk(id, c.epoch.Load())
		r, err = viaCalls(ctx, c.calls, &pb.CallRequest{Call: &pb.CallRequest_Allocate{Allocate: req}},
			(*pb.CallReply).GetAllocate,
			func() (*pb.AllocateResponse, error) { return c.rpc.Allocate(ctx, req) })
		if err == nil {
			err = c.observe(r.Epoch)
		}
		return err
	})
	return r, c.explain(ctx, err)
}

// free makes a Free call of extents on the connection's Calls stream, or
// unary when the stream cannot take it, sent again as retry says.
func (c *Client) free(ctx context.Context, extents []*pb.Extent) (*pb.FreeResponse, error) {
	id := c.requestID()
	var r *pb.FreeResponse
	err := c.retry(ctx, func() (err error) {
		req := &pb.FreeRequest{Device: c.device, Extents: extents, RequestId: id, Epoch: c.epoch.Load()}
		r, err = viaCalls(ctx, c.calls, &pb.CallRequest{Call: &pb.CallRequest_Free{Free: req}},
			(*pb.CallReply).GetFree,
			func() (*pb.FreeResponse, error) { return c.rpc.Free(ctx, req) })
		if err == nil {
			err = c.observe(r.Epoch)
		}
		return err
	})
	return r, err
}

// commit makes a lease's Commit call on the connection's Calls stream, or
// unary when the stream cannot take it, once: a leasing allocator resends
// a commit itself. It sets req's epoch.
func (c *Client) commit(ctx context.Context, req *pb.CommitRequest) (*pb.CommitResponse, error) {
	req.Epoch = c.epoch.Load()
	r, err := viaCalls(ctx, c.calls, &pb.CallRequest{Call: &pb.CallRequest_Commit{Commit: req}},
		(*pb.CallReply).GetCommit,
		func() (*pb.CommitResponse, error) { return c.rpc.Commit(ctx, req) })
	if err == nil {
		err = c.observe(r.Epoch)
	}
	return r, err
}

func invalid(format string, args ...any) error {
	return &RefusedError{Code: codes.InvalidArgument, Reason: fmt.Sprintf(format, args...)}
}

// Allocate allocates one contiguous object of n blocks; durable when it
// returns. When the device has no free run of n blocks the error is a
// *NoSpaceError (ErrNoSpace) with the server's NoSpaceDetails; past the
// tenant's quota, a *QuotaError (ErrQuota). A call that did not get
// through is sent again with its request id for Options.RetryFor (see
// Client); ErrUnavailable or ErrOutcomeUnknown once that ran out or ctx
// ended.
func (c *Client) Allocate(ctx context.Context, n uint64) (Extent, error) {
	es, err := c.AllocateMany(ctx, 1, n, nil)
	if err != nil {
		return Extent{}, err
	}
	return es[0], nil
}

// AllocateMany allocates count contiguous objects of n blocks each, near
// block *hint when hint is not nil, all or nothing; durable when it returns.
func (c *Client) AllocateMany(ctx context.Context, count uint32, n uint64, hint *uint64) ([]Extent, error) {
	if count == 0 || n == 0 {
		return nil, invalid("cannot allocate %d objects of %d blocks: both must be at least 1", count, n)
	}
	r, err := c.allocate(ctx, func(id, epoch uint64) *pb.AllocateRequest {
		return &pb.AllocateRequest{
			Device:    c.device,
			Count:     count,
			Size:      &pb.AllocateRequest_Blocks{Blocks: n},
			Hint:      hint,
			RequestId: id,
			Epoch:     epoch,
		}
	})
	if err != nil {
		return nil, err
	}
	return contiguous(r, count, n)
}

// contiguous checks an Allocate reply of count contiguous objects of
// blocks blocks and returns them.
func contiguous(r *pb.AllocateResponse, count uint32, blocks uint64) ([]Extent, error) {
	if len(r.Objects) != int(count) {
		return nil, badReply("%d objects asked, %d returned", count, len(r.Objects))
	}
	out := make([]Extent, 0, count)
	for _, o := range r.Objects {
		if len(o.Extents) != 1 {
			return nil, badReply("a contiguous object came back as %d extents", len(o.Extents))
		}
		e, err := fromPB(o.Extents[0])
		if err != nil {
			return nil, err
		}
		if e.Len != blocks {
			return nil, badReply("asked %d blocks, got %s", blocks, e)
		}
		out = append(out, e)
	}
	return out, nil
}

// AllocateScattered allocates one object of n blocks in as few extents as
// the server finds; durable when it returns.
func (c *Client) AllocateScattered(ctx context.Context, n uint64) ([]Extent, error) {
	if n == 0 {
		return nil, invalid("cannot allocate zero blocks")
	}
	r, err := c.allocate(ctx, func(id, epoch uint64) *pb.AllocateRequest {
		return &pb.AllocateRequest{
			Device:    c.device,
			Count:     1,
			Size:      &pb.AllocateRequest_Blocks{Blocks: n},
			Scattered: true,
			RequestId: id,
			Epoch:     epoch,
		}
	})
	if err != nil {
		return nil, err
	}
	if len(r.Objects) != 1 {
		return nil, badReply("1 object asked, %d returned", len(r.Objects))
	}
	out := make([]Extent, 0, len(r.Objects[0].Extents))
	var total uint64
	for _, pe := range r.Objects[0].Extents {
		e, err := fromPB(pe)
		if err != nil {
			return nil, err
		}
		total += e.Len
		out = append(out, e)
	}
	if total != n {
		return nil, badReply("asked %d blocks, got %d in %d extents", n, total, len(out))
	}
	return out, nil
}

// Free frees committed extents (pairwise disjoint, at most MaxBatch), all
// or nothing; durable when it returns. It returns the blocks freed.
func (c *Client) Free(ctx context.Context, extents ...Extent) (uint64, error) {
	if len(extents) == 0 {
		return 0, nil
	}
	r, err := c.free(ctx, toPBs(extents))
	if err != nil {
		return 0, err
	}
	return r.Blocks, nil
}

// Status is the space accounting of the client's device.
func (c *Client) Status(ctx context.Context) (*DeviceStatus, error) {
	r, err := c.rpc.Status(ctx, &pb.StatusRequest{Device: c.device})
	if err != nil {
		return nil, c.explain(ctx, statusError(ctx, err))
	}
	if len(r.Devices) != 1 {
		return nil, badReply("status of one device asked, %d returned", len(r.Devices))
	}
	if err := c.observe(r.Devices[0].Epoch); err != nil {
		return nil, err
	}
	return r.Devices[0], nil
}
