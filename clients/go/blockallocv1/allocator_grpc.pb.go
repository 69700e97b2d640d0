// The blockalloc allocation service: a server owns one or more devices
// (each a durable blockalloc store) and hands out space to clients.
//
// Units: every extent is in blocks of the device's block size (see
// DeviceStatus.block_size); block 0 is the first block of the device.
//
// Two ways to allocate:
//   * per call: Allocate and Free, each durable when it returns;
//   * leased: Lease grants a region of free space for a time to live; the
//     client allocates inside it locally, reports what it used with Commit
//     (durable on reply), keeps the lease alive with Renew, and hands the
//     unused remainder back with Release. A lease that is not renewed in
//     time expires: its uncommitted part becomes free again, after a
//     quarantine of the lease's margin. Grants, extensions, releases and
//     expiries are journaled: a restarted server restores every live lease
//     with a full TTL from its start and accepts its commits and renewals.
//
// The writer's rule. Every lease reply carries `ttl_ms` and `margin_ms`;
// a client computes the lease's deadline as the time it *sent* the request
// that the reply answers, plus ttl_ms, minus margin_ms. Until that
// deadline the client may write object data into space it allocated from
// the lease without committing it; after it, it must not write into
// uncommitted space (commit first: a commit that succeeds makes the space
// the client's for good), and it allocates nothing more from the lease.
// The server frees an expired lease's space only margin_ms after the
// expiry, so a client that keeps the rule never writes into space that
// anyone else holds, whatever the network or the scheduler did.
//
// Fencing. Every device carries an owner epoch, raised and made durable
// each time a server opens the device, before it serves anything (or set
// from outside, e.g. a coordination service's revision; it only grows).
// Every reply carries the device's epoch and every request may carry the
// newest epoch its client has seen (0: none). A server refuses a request
// with a newer epoch than its own (UNAVAILABLE, "fenced"): it is a stale
// owner. A client refuses a reply with an older epoch than one it has seen
// for the device (and retries): it came from a stale owner. Lease ids carry
// the low 16 bits of the epoch that granted them.
//
// Retries. Allocate and Free take a client-chosen request id. The server
// journals the id with the call's result, in the same journal entry, and
// keeps the results of the device's last 4096 calls with ids (fewer on a
// device whose journal is too small to hold them: the oldest go first): a
// call resent with the same id and the same contents gets the first call's
// result (`replayed` set) instead of a second allocation or a spurious
// double free, even across a restart. The same id with other contents (or
// used by the other kind of call) is INVALID_ARGUMENT; while the first call
// with the id still runs, a resend is UNAVAILABLE (retry). Ids are kept per
// tenant on a server with tenants. A client retries a call that ended
// UNAVAILABLE, DEADLINE_EXCEEDED or with a broken connection with the same
// id.
//
// Errors are gRPC status codes with a message a person can act on:
//   INVALID_ARGUMENT     a malformed request: zero length, an extent out of
//                        the device's range, a count or batch too large;
//   FAILED_PRECONDITION  the request is well formed but conflicts with the
//                        device's state: a free of space that is already
//                        free (or not committed), a commit outside the
//                        caller's lease, a lease that expired or was
//                        released, a sequence number conflict;
//   RESOURCE_EXHAUSTED   no space of the requested shape (or too little
//                        free space to grant a lease);
//   NOT_FOUND            an unknown device or lease (for a lease: one that
//                        ended long ago, or was never granted);
//   UNAVAILABLE          the server is shutting down or its device failed,
//                        or it is fenced: a client has seen a newer epoch
//                        of the device (retry elsewhere or later).
//   UNAUTHENTICATED      on a server with tenants: no `authorization:
//                        Bearer TOKEN` metadata, or an unknown token;
//   PERMISSION_DENIED    on a server with tenants: a device the caller's
//                        tenant may not use, an extent outside its regions
//                        (another tenant's space), or another tenant's
//                        lease; nothing is changed;
//   RESOURCE_EXHAUSTED   also when a call would take the tenant past its
//                        quota on the device (the message names tenant,
//                        device and bytes; a QuotaDetails in the details,
//                        CallError.quota on the Calls stream, marks it);
//   INTERNAL             a broken invariant in the server (a bug), or a
//                        request body that is not a valid message;
// and, for the server's limits (each message names the limit and its value):
//   RESOURCE_EXHAUSTED   too many live leases for the caller or the server,
//                        or an Allocate reply larger than the message limit
//                        (nothing is allocated);
//   UNAVAILABLE          the caller has too many calls running or waiting;
//                        retry later;
//   OUT_OF_RANGE         a request larger than the message limit (4 MiB);
//   CANCELLED            a call not done within the request timeout.
// Limits are counted per caller: on a server with tenants the tenant, else
// the `blockalloc-client` request header (1 to 128 ASCII bytes;
// INVALID_ARGUMENT otherwise), else the connection.
// Every NOT_FOUND or FAILED_PRECONDITION about a lease that is unknown,
// expired or released has a message containing "take a new lease", so that
// a client can tell a lost lease from a refused batch.

// Code generated by protoc-gen-go-grpc. DO NOT EDIT.
// versions:
// - protoc-gen-go-grpc v1.6.2
// - protoc             v3.21.12
// source: blockalloc/v1/allocator.proto

package blockallocv1

import (
	context "context"
	grpc "google.golang.org/grpc"
	codes "google.golang.org/grpc/codes"
	status "google.golang.org/grpc/status"
)

// This is a compile-time assertion to ensure that this generated file
// is compatible with the grpc package it is being compiled against.
// Requires gRPC-Go v1.64.0 or later.
const _ = grpc.SupportPackageIsVersion9

const (
	Allocator_Allocate_FullMethodName      = "/blockalloc.v1.Allocator/Allocate"
	Allocator_Free_FullMethodName          = "/blockalloc.v1.Allocator/Free"
	Allocator_Status_FullMethodName        = "/blockalloc.v1.Allocator/Status"
	Allocator_Lease_FullMethodName         = "/blockalloc.v1.Allocator/Lease"
	Allocator_Commit_FullMethodName        = "/blockalloc.v1.Allocator/Commit"
	Allocator_Renew_FullMethodName         = "/blockalloc.v1.Allocator/Renew"
	Allocator_Release_FullMethodName       = "/blockalloc.v1.Allocator/Release"
	Allocator_WatchRecalls_FullMethodName  = "/blockalloc.v1.Allocator/WatchRecalls"
	Allocator_Calls_FullMethodName         = "/blockalloc.v1.Allocator/Calls"
	Allocator_WatchTopology_FullMethodName = "/blockalloc.v1.Allocator/WatchTopology"
)

// AllocatorClient is the client API for Allocator service.
//
// For semantics around ctx use and closing/ending streaming RPCs, please refer to https://pkg.go.dev/google.golang.org/grpc/?tab=doc#ClientConn.NewStream.
//
// The allocation service.
type AllocatorClient interface {
	// Allocates `count` objects, all or nothing; durable when it returns.
	// Errors: INVALID_ARGUMENT (count 0 or above the limit, size 0, hint past
	// the device), NOT_FOUND (device), RESOURCE_EXHAUSTED (no space; nothing
	// is allocated), UNAVAILABLE. A refusal because the device had no free
	// run for an object carries a NoSpaceDetails: in the status details
	// (google.rpc.Status, grpc-status-details-bin) of a unary call, as
	// CallError.no_space on the Calls stream.
	Allocate(ctx context.Context, in *AllocateRequest, opts ...grpc.CallOption) (*AllocateResponse, error)
	// Frees a batch of extents, all or nothing; durable when it returns.
	// Errors: INVALID_ARGUMENT (empty or too large batch, zero length, out of
	// range, overlapping extents in the batch), FAILED_PRECONDITION (part of
	// an extent is free, leased, not yet committed, or the metadata area;
	// nothing is freed), NOT_FOUND (device), UNAVAILABLE.
	Free(ctx context.Context, in *FreeRequest, opts ...grpc.CallOption) (*FreeResponse, error)
	// Space accounting of one device or of all, and with `leases` set the
	// live leases on them.
	// Errors: NOT_FOUND (device).
	Status(ctx context.Context, in *StatusRequest, opts ...grpc.CallOption) (*StatusResponse, error)
	// Grants a lease: a region of free space reserved for the caller until
	// it expires. Free space reported by Status and granted by leases never
	// counts a lease's unused part, so grants never over-commit the device.
	// Errors: INVALID_ARGUMENT (min_blocks 0), NOT_FOUND (device),
	// RESOURCE_EXHAUSTED (no free run of min_blocks blocks, or too little
	// unleased space left to grant one; allocate per call instead). Such a
	// refusal starts a recall for one TTL: Commit and Renew replies ask
	// every holder for its lease back (and WatchRecalls streams announce it
	// at once), and no lease is granted meanwhile (RESOURCE_EXHAUSTED as
	// well). On a server with tenants a recall is the tenant's: it concerns
	// only that tenant's leases and grants.
	Lease(ctx context.Context, in *LeaseRequest, opts ...grpc.CallOption) (*LeaseResponse, error)
	// Makes allocations inside the caller's lease durable, and frees a batch
	// of committed extents, in one journal entry; durable on reply.
	// Idempotent per (lease_id, sequence): resending the last committed
	// sequence returns its first reply and changes nothing.
	// Errors: INVALID_ARGUMENT (empty or too large batch, zero length, out of
	// range), NOT_FOUND (lease unknown to this server run),
	// FAILED_PRECONDITION (an allocation outside the unused part of the
	// lease, the lease expired or was released, a sequence that is neither
	// the last one nor the next one, a resent sequence with other contents, a
	// free of space that is not committed-allocated), UNAVAILABLE. On any
	// error nothing of the batch is applied.
	Commit(ctx context.Context, in *CommitRequest, opts ...grpc.CallOption) (*CommitResponse, error)
	// Keeps a lease alive for another TTL; the reply can ask the client to
	// give the lease back (recall) because the device is nearly full.
	// Errors: NOT_FOUND (lease unknown to this server run),
	// FAILED_PRECONDITION (the lease expired or was released).
	Renew(ctx context.Context, in *RenewRequest, opts ...grpc.CallOption) (*RenewResponse, error)
	// Ends a lease: its unused (uncommitted) remainder becomes free space.
	// Errors: NOT_FOUND (lease unknown to this server run),
	// FAILED_PRECONDITION (the lease already expired or was released).
	Release(ctx context.Context, in *ReleaseRequest, opts ...grpc.CallOption) (*ReleaseResponse, error)
	// Streams a device's recalls as they start, so that lease holders give
	// their unused space back at once rather than at their next Renew or
	// Commit (a third of a TTL away). The first message says whether a
	// recall is in progress now; one more follows each recall that starts.
	// The stream ends when the server stops; a client that loses it can
	// open it again (and still learns of recalls from Renew and Commit).
	// Errors: NOT_FOUND (device), PERMISSION_DENIED (a device outside the
	// tenant's rights).
	WatchRecalls(ctx context.Context, in *WatchRecallsRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[RecallEvent], error)
	// Allocate, Free and Commit calls on one long-lived stream: each
	// CallRequest is one call, with the same meaning, limits and errors as the
	// unary call it carries, and gets exactly one CallReply with its id, in
	// any order (calls run concurrently and share group commits). A stream
	// saves the per-call request setup of a unary call (about half of its
	// round trip on loopback). A call's error is its reply's `error`; the
	// stream itself goes on. The server runs at most as many calls of a stream
	// at once as a connection may carry (`max_streams_per_connection`) and
	// reads no further until one is answered; a call not answered within the
	// request timeout gets CANCELLED, as a unary call would. When the server
	// stops, it sends a stop notice (a CallReply with id 0 and an UNAVAILABLE
	// error), answers the calls it read before, keeps reading, and answers
	// each call it reads from then on UNAVAILABLE without running it; it ends
	// the stream once the client has closed its side, so that every call
	// sent gets its reply. A client closes its side on the notice (and sends
	// further calls elsewhere). A client that keeps its side open longer than
	// the server's `stop_grace` has the stream ended: a call left without a
	// reply then may or may not have run.
	// Errors of the stream: UNAUTHENTICATED (a server with tenants and no
	// valid token), OUT_OF_RANGE (a message over the server's size limit),
	// INTERNAL (a message that does not decode); the stream ends with them.
	Calls(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[CallRequest, CallReply], error)
	// The cluster this server is a member of, as its etcd holds it: live
	// servers, owned devices with their owners, epochs and space. The first
	// message is the cluster now; one more follows each change the server
	// sees in etcd (an owner's space changes at most about once a second).
	// Clients learn the topology here, from any server, and need no etcd
	// credentials. On a server with tenants a tenant sees only the devices
	// it may use (by name, as this server's tenants file grants them; the
	// servers of a cluster are meant to share one). The stream ends when the
	// server stops; a client opens it again on another server.
	// Errors: FAILED_PRECONDITION (the server is not in a cluster),
	// UNAVAILABLE (the server cannot renew its cluster lease, so its view may
	// be stale: the stream ends with it, and a new one is refused).
	WatchTopology(ctx context.Context, in *WatchTopologyRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[Topology], error)
}

type allocatorClient struct {
	cc grpc.ClientConnInterface
}

func NewAllocatorClient(cc grpc.ClientConnInterface) AllocatorClient {
	return &allocatorClient{cc}
}

func (c *allocatorClient) Allocate(ctx context.Context, in *AllocateRequest, opts ...grpc.CallOption) (*AllocateResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(AllocateResponse)
	err := c.cc.Invoke(ctx, Allocator_Allocate_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *allocatorClient) Free(ctx context.Context, in *FreeRequest, opts ...grpc.CallOption) (*FreeResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(FreeResponse)
	err := c.cc.Invoke(ctx, Allocator_Free_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *allocatorClient) Status(ctx context.Context, in *StatusRequest, opts ...grpc.CallOption) (*StatusResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(StatusResponse)
	err := c.cc.Invoke(ctx, Allocator_Status_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *allocatorClient) Lease(ctx context.Context, in *LeaseRequest, opts ...grpc.CallOption) (*LeaseResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(LeaseResponse)
	err := c.cc.Invoke(ctx, Allocator_Lease_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *allocatorClient) Commit(ctx context.Context, in *CommitRequest, opts ...grpc.CallOption) (*CommitResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(CommitResponse)
	err := c.cc.Invoke(ctx, Allocator_Commit_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *allocatorClient) Renew(ctx context.Context, in *RenewRequest, opts ...grpc.CallOption) (*RenewResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(RenewResponse)
	err := c.cc.Invoke(ctx, Allocator_Renew_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *allocatorClient) Release(ctx context.Context, in *ReleaseRequest, opts ...grpc.CallOption) (*ReleaseResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(ReleaseResponse)
	err := c.cc.Invoke(ctx, Allocator_Release_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *allocatorClient) WatchRecalls(ctx context.Context, in *WatchRecallsRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[RecallEvent], error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	stream, err := c.cc.NewStream(ctx, &Allocator_ServiceDesc.Streams[0], Allocator_WatchRecalls_FullMethodName, cOpts...)
	if err != nil {
		return nil, err
	}
	x := &grpc.GenericClientStream[WatchRecallsRequest, RecallEvent]{ClientStream: stream}
	if err := x.ClientStream.SendMsg(in); err != nil {
		return nil, err
	}
	if err := x.ClientStream.CloseSend(); err != nil {
		return nil, err
	}
	return x, nil
}

// This type alias is provided for backwards compatibility with existing code that references the prior non-generic stream type by name.
type Allocator_WatchRecallsClient = grpc.ServerStreamingClient[RecallEvent]

func (c *allocatorClient) Calls(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[CallRequest, CallReply], error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	stream, err := c.cc.NewStream(ctx, &Allocator_ServiceDesc.Streams[1], Allocator_Calls_FullMethodName, cOpts...)
	if err != nil {
		return nil, err
	}
	x := &grpc.GenericClientStream[CallRequest, CallReply]{ClientStream: stream}
	return x, nil
}

// This type alias is provided for backwards compatibility with existing code that references the prior non-generic stream type by name.
type Allocator_CallsClient = grpc.BidiStreamingClient[CallRequest, CallReply]

func (c *allocatorClient) WatchTopology(ctx context.Context, in *WatchTopologyRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[Topology], error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	stream, err := c.cc.NewStream(ctx, &Allocator_ServiceDesc.Streams[2], Allocator_WatchTopology_FullMethodName, cOpts...)
	if err != nil {
		return nil, err
	}
	x := &grpc.GenericClientStream[WatchTopologyRequest, Topology]{ClientStream: stream}
	if err := x.ClientStream.SendMsg(in); err != nil {
		return nil, err
	}
	if err := x.ClientStream.CloseSend(); err != nil {
		return nil, err
	}
	return x, nil
}

// This type alias is provided for backwards compatibility with existing code that references the prior non-generic stream type by name.
type Allocator_WatchTopologyClient = grpc.ServerStreamingClient[Topology]

// AllocatorServer is the server API for Allocator service.
// All implementations must embed UnimplementedAllocatorServer
// for forward compatibility.
//
// The allocation service.
type AllocatorServer interface {
	// Allocates `count` objects, all or nothing; durable when it returns.
	// Errors: INVALID_ARGUMENT (count 0 or above the limit, size 0, hint past
	// the device), NOT_FOUND (device), RESOURCE_EXHAUSTED (no space; nothing
	// is allocated), UNAVAILABLE. A refusal because the device had no free
	// run for an object carries a NoSpaceDetails: in the status details
	// (google.rpc.Status, grpc-status-details-bin) of a unary call, as
	// CallError.no_space on the Calls stream.
	Allocate(context.Context, *AllocateRequest) (*AllocateResponse, error)
	// Frees a batch of extents, all or nothing; durable when it returns.
	// Errors: INVALID_ARGUMENT (empty or too large batch, zero length, out of
	// range, overlapping extents in the batch), FAILED_PRECONDITION (part of
	// an extent is free, leased, not yet committed, or the metadata area;
	// nothing is freed), NOT_FOUND (device), UNAVAILABLE.
	Free(context.Context, *FreeRequest) (*FreeResponse, error)
	// Space accounting of one device or of all, and with `leases` set the
	// live leases on them.
	// Errors: NOT_FOUND (device).
	Status(context.Context, *StatusRequest) (*StatusResponse, error)
	// Grants a lease: a region of free space reserved for the caller until
	// it expires. Free space reported by Status and granted by leases never
	// counts a lease's unused part, so grants never over-commit the device.
	// Errors: INVALID_ARGUMENT (min_blocks 0), NOT_FOUND (device),
	// RESOURCE_EXHAUSTED (no free run of min_blocks blocks, or too little
	// unleased space left to grant one; allocate per call instead). Such a
	// refusal starts a recall for one TTL: Commit and Renew replies ask
	// every holder for its lease back (and WatchRecalls streams announce it
	// at once), and no lease is granted meanwhile (RESOURCE_EXHAUSTED as
	// well). On a server with tenants a recall is the tenant's: it concerns
	// only that tenant's leases and grants.
	Lease(context.Context, *LeaseRequest) (*LeaseResponse, error)
	// Makes allocations inside the caller's lease durable, and frees a batch
	// of committed extents, in one journal entry; durable on reply.
	// Idempotent per (lease_id, sequence): resending the last committed
	// sequence returns its first reply and changes nothing.
	// Errors: INVALID_ARGUMENT (empty or too large batch, zero length, out of
	// range), NOT_FOUND (lease unknown to this server run),
	// FAILED_PRECONDITION (an allocation outside the unused part of the
	// lease, the lease expired or was released, a sequence that is neither
	// the last one nor the next one, a resent sequence with other contents, a
	// free of space that is not committed-allocated), UNAVAILABLE. On any
	// error nothing of the batch is applied.
	Commit(context.Context, *CommitRequest) (*CommitResponse, error)
	// Keeps a lease alive for another TTL; the reply can ask the client to
	// give the lease back (recall) because the device is nearly full.
	// Errors: NOT_FOUND (lease unknown to this server run),
	// FAILED_PRECONDITION (the lease expired or was released).
	Renew(context.Context, *RenewRequest) (*RenewResponse, error)
	// Ends a lease: its unused (uncommitted) remainder becomes free space.
	// Errors: NOT_FOUND (lease unknown to this server run),
	// FAILED_PRECONDITION (the lease already expired or was released).
	Release(context.Context, *ReleaseRequest) (*ReleaseResponse, error)
	// Streams a device's recalls as they start, so that lease holders give
	// their unused space back at once rather than at their next Renew or
	// Commit (a third of a TTL away). The first message says whether a
	// recall is in progress now; one more follows each recall that starts.
	// The stream ends when the server stops; a client that loses it can
	// open it again (and still learns of recalls from Renew and Commit).
	// Errors: NOT_FOUND (device), PERMISSION_DENIED (a device outside the
	// tenant's rights).
	WatchRecalls(*WatchRecallsRequest, grpc.ServerStreamingServer[RecallEvent]) error
	// Allocate, Free and Commit calls on one long-lived stream: each
	// CallRequest is one call, with the same meaning, limits and errors as the
	// unary call it carries, and gets exactly one CallReply with its id, in
	// any order (calls run concurrently and share group commits). A stream
	// saves the per-call request setup of a unary call (about half of its
	// round trip on loopback). A call's error is its reply's `error`; the
	// stream itself goes on. The server runs at most as many calls of a stream
	// at once as a connection may carry (`max_streams_per_connection`) and
	// reads no further until one is answered; a call not answered within the
	// request timeout gets CANCELLED, as a unary call would. When the server
	// stops, it sends a stop notice (a CallReply with id 0 and an UNAVAILABLE
	// error), answers the calls it read before, keeps reading, and answers
	// each call it reads from then on UNAVAILABLE without running it; it ends
	// the stream once the client has closed its side, so that every call
	// sent gets its reply. A client closes its side on the notice (and sends
	// further calls elsewhere). A client that keeps its side open longer than
	// the server's `stop_grace` has the stream ended: a call left without a
	// reply then may or may not have run.
	// Errors of the stream: UNAUTHENTICATED (a server with tenants and no
	// valid token), OUT_OF_RANGE (a message over the server's size limit),
	// INTERNAL (a message that does not decode); the stream ends with them.
	Calls(grpc.BidiStreamingServer[CallRequest, CallReply]) error
	// The cluster this server is a member of, as its etcd holds it: live
	// servers, owned devices with their owners, epochs and space. The first
	// message is the cluster now; one more follows each change the server
	// sees in etcd (an owner's space changes at most about once a second).
	// Clients learn the topology here, from any server, and need no etcd
	// credentials. On a server with tenants a tenant sees only the devices
	// it may use (by name, as this server's tenants file grants them; the
	// servers of a cluster are meant to share one). The stream ends when the
	// server stops; a client opens it again on another server.
	// Errors: FAILED_PRECONDITION (the server is not in a cluster),
	// UNAVAILABLE (the server cannot renew its cluster lease, so its view may
	// be stale: the stream ends with it, and a new one is refused).
	WatchTopology(*WatchTopologyRequest, grpc.ServerStreamingServer[Topology]) error
	mustEmbedUnimplementedAllocatorServer()
}

// UnimplementedAllocatorServer must be embedded to have
// forward compatible implementations.
//
// NOTE: this should be embedded by value instead of pointer to avoid a nil
// pointer dereference when methods are called.
type UnimplementedAllocatorServer struct{}

func (UnimplementedAllocatorServer) Allocate(context.Context, *AllocateRequest) (*AllocateResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Allocate not implemented")
}
func (UnimplementedAllocatorServer) Free(context.Context, *FreeRequest) (*FreeResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Free not implemented")
}
func (UnimplementedAllocatorServer) Status(context.Context, *StatusRequest) (*StatusResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Status not implemented")
}
func (UnimplementedAllocatorServer) Lease(context.Context, *LeaseRequest) (*LeaseResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Lease not implemented")
}
func (UnimplementedAllocatorServer) Commit(context.Context, *CommitRequest) (*CommitResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Commit not implemented")
}
func (UnimplementedAllocatorServer) Renew(context.Context, *RenewRequest) (*RenewResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Renew not implemented")
}
func (UnimplementedAllocatorServer) Release(context.Context, *ReleaseRequest) (*ReleaseResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Release not implemented")
}
func (UnimplementedAllocatorServer) WatchRecalls(*WatchRecallsRequest, grpc.ServerStreamingServer[RecallEvent]) error {
	return status.Error(codes.Unimplemented, "method WatchRecalls not implemented")
}
func (UnimplementedAllocatorServer) Calls(grpc.BidiStreamingServer[CallRequest, CallReply]) error {
	return status.Error(codes.Unimplemented, "method Calls not implemented")
}
func (UnimplementedAllocatorServer) WatchTopology(*WatchTopologyRequest, grpc.ServerStreamingServer[Topology]) error {
	return status.Error(codes.Unimplemented, "method WatchTopology not implemented")
}
func (UnimplementedAllocatorServer) mustEmbedUnimplementedAllocatorServer() {}
func (UnimplementedAllocatorServer) testEmbeddedByValue()                   {}

// UnsafeAllocatorServer may be embedded to opt out of forward compatibility for this service.
// Use of this interface is not recommended, as added methods to AllocatorServer will
// result in compilation errors.
type UnsafeAllocatorServer interface {
	mustEmbedUnimplementedAllocatorServer()
}

func RegisterAllocatorServer(s grpc.ServiceRegistrar, srv AllocatorServer) {
	// If the following call panics, it indicates UnimplementedAllocatorServer was
	// embedded by pointer and is nil.  This will cause panics if an
	// unimplemented method is ever invoked, so we test this at initialization
	// time to prevent it from happening at runtime later due to I/O.
	if t, ok := srv.(interface{ testEmbeddedByValue() }); ok {
		t.testEmbeddedByValue()
	}
	s.RegisterService(&Allocator_ServiceDesc, srv)
}

func _Allocator_Allocate_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(AllocateRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(AllocatorServer).Allocate(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Allocator_Allocate_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(AllocatorServer).Allocate(ctx, req.(*AllocateRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Allocator_Free_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(FreeRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(AllocatorServer).Free(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Allocator_Free_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(AllocatorServer).Free(ctx, req.(*FreeRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Allocator_Status_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(StatusRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(AllocatorServer).Status(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Allocator_Status_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(AllocatorServer).Status(ctx, req.(*StatusRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Allocator_Lease_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(LeaseRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(AllocatorServer).Lease(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Allocator_Lease_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(AllocatorServer).Lease(ctx, req.(*LeaseRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Allocator_Commit_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(CommitRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(AllocatorServer).Commit(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Allocator_Commit_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(AllocatorServer).Commit(ctx, req.(*CommitRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Allocator_Renew_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(RenewRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(AllocatorServer).Renew(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Allocator_Renew_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(AllocatorServer).Renew(ctx, req.(*RenewRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Allocator_Release_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(ReleaseRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(AllocatorServer).Release(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Allocator_Release_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(AllocatorServer).Release(ctx, req.(*ReleaseRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Allocator_WatchRecalls_Handler(srv interface{}, stream grpc.ServerStream) error {
	m := new(WatchRecallsRequest)
	if err := stream.RecvMsg(m); err != nil {
		return err
	}
	return srv.(AllocatorServer).WatchRecalls(m, &grpc.GenericServerStream[WatchRecallsRequest, RecallEvent]{ServerStream: stream})
}

// This type alias is provided for backwards compatibility with existing code that references the prior non-generic stream type by name.
type Allocator_WatchRecallsServer = grpc.ServerStreamingServer[RecallEvent]

func _Allocator_Calls_Handler(srv interface{}, stream grpc.ServerStream) error {
	return srv.(AllocatorServer).Calls(&grpc.GenericServerStream[CallRequest, CallReply]{ServerStream: stream})
}

// This type alias is provided for backwards compatibility with existing code that references the prior non-generic stream type by name.
type Allocator_CallsServer = grpc.BidiStreamingServer[CallRequest, CallReply]

func _Allocator_WatchTopology_Handler(srv interface{}, stream grpc.ServerStream) error {
	m := new(WatchTopologyRequest)
	if err := stream.RecvMsg(m); err != nil {
		return err
	}
	return srv.(AllocatorServer).WatchTopology(m, &grpc.GenericServerStream[WatchTopologyRequest, Topology]{ServerStream: stream})
}

// This type alias is provided for backwards compatibility with existing code that references the prior non-generic stream type by name.
type Allocator_WatchTopologyServer = grpc.ServerStreamingServer[Topology]

// Allocator_ServiceDesc is the grpc.ServiceDesc for Allocator service.
// It's only intended for direct use with grpc.RegisterService,
// and not to be introspected or modified (even as a copy)
var Allocator_ServiceDesc = grpc.ServiceDesc{
	ServiceName: "blockalloc.v1.Allocator",
	HandlerType: (*AllocatorServer)(nil),
	Methods: []grpc.MethodDesc{
		{
			MethodName: "Allocate",
			Handler:    _Allocator_Allocate_Handler,
		},
		{
			MethodName: "Free",
			Handler:    _Allocator_Free_Handler,
		},
		{
			MethodName: "Status",
			Handler:    _Allocator_Status_Handler,
		},
		{
			MethodName: "Lease",
			Handler:    _Allocator_Lease_Handler,
		},
		{
			MethodName: "Commit",
			Handler:    _Allocator_Commit_Handler,
		},
		{
			MethodName: "Renew",
			Handler:    _Allocator_Renew_Handler,
		},
		{
			MethodName: "Release",
			Handler:    _Allocator_Release_Handler,
		},
	},
	Streams: []grpc.StreamDesc{
		{
			StreamName:    "WatchRecalls",
			Handler:       _Allocator_WatchRecalls_Handler,
			ServerStreams: true,
		},
		{
			StreamName:    "Calls",
			Handler:       _Allocator_Calls_Handler,
			ServerStreams: true,
			ClientStreams: true,
		},
		{
			StreamName:    "WatchTopology",
			Handler:       _Allocator_WatchTopology_Handler,
			ServerStreams: true,
		},
	},
	Metadata: "blockalloc/v1/allocator.proto",
}
