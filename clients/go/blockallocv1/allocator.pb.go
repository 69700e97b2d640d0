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

// Code generated by protoc-gen-go. DO NOT EDIT.
// versions:
// 	protoc-gen-go v1.36.12
// 	protoc        v3.21.12
// source: blockalloc/v1/allocator.proto

package blockallocv1

import (
	protoreflect "google.golang.org/protobuf/reflect/protoreflect"
	protoimpl "google.golang.org/protobuf/runtime/protoimpl"
	reflect "reflect"
	sync "sync"
	unsafe "unsafe"
)

const (
	// Verify that this generated code is sufficiently up-to-date.
	_ = protoimpl.EnforceVersion(20 - protoimpl.MinVersion)
	// Verify that runtime/protoimpl is sufficiently up-to-date.
	_ = protoimpl.EnforceVersion(protoimpl.MaxVersion - 20)
)

// A device of the server: by name or by index. Unset means index 0.
type DeviceRef struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// Which device.
	//
	// Types that are valid to be assigned to Ref:
	//
	//	*DeviceRef_Name
	//	*DeviceRef_Index
	Ref           isDeviceRef_Ref `protobuf_oneof:"ref"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *DeviceRef) Reset() {
	*x = DeviceRef{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[0]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *DeviceRef) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*DeviceRef) ProtoMessage() {}

func (x *DeviceRef) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[0]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use DeviceRef.ProtoReflect.Descriptor instead.
func (*DeviceRef) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{0}
}

func (x *DeviceRef) GetRef() isDeviceRef_Ref {
	if x != nil {
		return x.Ref
	}
	return nil
}

func (x *DeviceRef) GetName() string {
	if x != nil {
		if x, ok := x.Ref.(*DeviceRef_Name); ok {
			return x.Name
		}
	}
	return ""
}

func (x *DeviceRef) GetIndex() uint32 {
	if x != nil {
		if x, ok := x.Ref.(*DeviceRef_Index); ok {
			return x.Index
		}
	}
	return 0
}

type isDeviceRef_Ref interface {
	isDeviceRef_Ref()
}

type DeviceRef_Name struct {
	// The device's name, as Status reports it (the file name of its path).
	Name string `protobuf:"bytes,1,opt,name=name,proto3,oneof"`
}

type DeviceRef_Index struct {
	// The device's position in the server's list, from 0.
	Index uint32 `protobuf:"varint,2,opt,name=index,proto3,oneof"`
}

func (*DeviceRef_Name) isDeviceRef_Ref() {}

func (*DeviceRef_Index) isDeviceRef_Ref() {}

// A run of blocks: `len` blocks from `start`.
type Extent struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// First block.
	Start uint64 `protobuf:"varint,1,opt,name=start,proto3" json:"start,omitempty"`
	// Number of blocks; at least 1.
	Len           uint64 `protobuf:"varint,2,opt,name=len,proto3" json:"len,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *Extent) Reset() {
	*x = Extent{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[1]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *Extent) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*Extent) ProtoMessage() {}

func (x *Extent) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[1]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use Extent.ProtoReflect.Descriptor instead.
func (*Extent) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{1}
}

func (x *Extent) GetStart() uint64 {
	if x != nil {
		return x.Start
	}
	return 0
}

func (x *Extent) GetLen() uint64 {
	if x != nil {
		return x.Len
	}
	return 0
}

// Allocate: `count` objects of one size.
type AllocateRequest struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The device; unset for device 0.
	Device *DeviceRef `protobuf:"bytes,1,opt,name=device,proto3" json:"device,omitempty"`
	// Objects to allocate: 1 up to the server's batch limit (4096).
	Count uint32 `protobuf:"varint,2,opt,name=count,proto3" json:"count,omitempty"`
	// The size of each object.
	//
	// Types that are valid to be assigned to Size:
	//
	//	*AllocateRequest_Blocks
	//	*AllocateRequest_Bytes
	Size isAllocateRequest_Size `protobuf_oneof:"size"`
	// False: each object is one extent (contiguous). True: an object may be
	// several extents (scattered), as few as the engine finds.
	Scattered bool `protobuf:"varint,5,opt,name=scattered,proto3" json:"scattered,omitempty"`
	// A block to allocate at or near (e.g. the end of the caller's previous
	// object); at most the device's block count. Only for contiguous objects.
	Hint *uint64 `protobuf:"varint,6,opt,name=hint,proto3,oneof" json:"hint,omitempty"`
	// Nonzero: the call's id for retries (see "Retries" above), unique per
	// client and device (e.g. a random 64-bit start, then counting up). 0: no
	// retry protection.
	RequestId uint64 `protobuf:"varint,7,opt,name=request_id,json=requestId,proto3" json:"request_id,omitempty"`
	// The newest epoch of the device the client has seen; 0 for none.
	Epoch         uint64 `protobuf:"varint,8,opt,name=epoch,proto3" json:"epoch,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *AllocateRequest) Reset() {
	*x = AllocateRequest{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[2]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *AllocateRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*AllocateRequest) ProtoMessage() {}

func (x *AllocateRequest) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[2]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use AllocateRequest.ProtoReflect.Descriptor instead.
func (*AllocateRequest) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{2}
}

func (x *AllocateRequest) GetDevice() *DeviceRef {
	if x != nil {
		return x.Device
	}
	return nil
}

func (x *AllocateRequest) GetCount() uint32 {
	if x != nil {
		return x.Count
	}
	return 0
}

func (x *AllocateRequest) GetSize() isAllocateRequest_Size {
	if x != nil {
		return x.Size
	}
	return nil
}

func (x *AllocateRequest) GetBlocks() uint64 {
	if x != nil {
		if x, ok := x.Size.(*AllocateRequest_Blocks); ok {
			return x.Blocks
		}
	}
	return 0
}

func (x *AllocateRequest) GetBytes() uint64 {
	if x != nil {
		if x, ok := x.Size.(*AllocateRequest_Bytes); ok {
			return x.Bytes
		}
	}
	return 0
}

func (x *AllocateRequest) GetScattered() bool {
	if x != nil {
		return x.Scattered
	}
	return false
}

func (x *AllocateRequest) GetHint() uint64 {
	if x != nil && x.Hint != nil {
		return *x.Hint
	}
	return 0
}

func (x *AllocateRequest) GetRequestId() uint64 {
	if x != nil {
		return x.RequestId
	}
	return 0
}

func (x *AllocateRequest) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

type isAllocateRequest_Size interface {
	isAllocateRequest_Size()
}

type AllocateRequest_Blocks struct {
	// In blocks; at least 1.
	Blocks uint64 `protobuf:"varint,3,opt,name=blocks,proto3,oneof"`
}

type AllocateRequest_Bytes struct {
	// In bytes, rounded up to whole blocks; at least 1.
	Bytes uint64 `protobuf:"varint,4,opt,name=bytes,proto3,oneof"`
}

func (*AllocateRequest_Blocks) isAllocateRequest_Size() {}

func (*AllocateRequest_Bytes) isAllocateRequest_Size() {}

// One allocated object.
type Object struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// Its extents, in allocation order; one when contiguous.
	Extents       []*Extent `protobuf:"bytes,1,rep,name=extents,proto3" json:"extents,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *Object) Reset() {
	*x = Object{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[3]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *Object) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*Object) ProtoMessage() {}

func (x *Object) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[3]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use Object.ProtoReflect.Descriptor instead.
func (*Object) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{3}
}

func (x *Object) GetExtents() []*Extent {
	if x != nil {
		return x.Extents
	}
	return nil
}

// Allocate's reply; durable when received.
type AllocateResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// `count` objects, in request order.
	Objects []*Object `protobuf:"bytes,1,rep,name=objects,proto3" json:"objects,omitempty"`
	// The device's block size in bytes.
	BlockSize uint64 `protobuf:"varint,2,opt,name=block_size,json=blockSize,proto3" json:"block_size,omitempty"`
	// True when this answers a resent request id: the objects are those the
	// first call allocated, nothing was allocated again.
	Replayed bool `protobuf:"varint,3,opt,name=replayed,proto3" json:"replayed,omitempty"`
	// The device's epoch.
	Epoch uint64 `protobuf:"varint,4,opt,name=epoch,proto3" json:"epoch,omitempty"`
	// The device's free blocks (as DeviceStatus.free_blocks) just after the
	// call: fresher than the cluster's published figure, for a client that
	// places objects across devices.
	FreeBlocks    uint64 `protobuf:"varint,5,opt,name=free_blocks,json=freeBlocks,proto3" json:"free_blocks,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *AllocateResponse) Reset() {
	*x = AllocateResponse{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[4]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *AllocateResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*AllocateResponse) ProtoMessage() {}

func (x *AllocateResponse) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[4]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use AllocateResponse.ProtoReflect.Descriptor instead.
func (*AllocateResponse) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{4}
}

func (x *AllocateResponse) GetObjects() []*Object {
	if x != nil {
		return x.Objects
	}
	return nil
}

func (x *AllocateResponse) GetBlockSize() uint64 {
	if x != nil {
		return x.BlockSize
	}
	return 0
}

func (x *AllocateResponse) GetReplayed() bool {
	if x != nil {
		return x.Replayed
	}
	return false
}

func (x *AllocateResponse) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

func (x *AllocateResponse) GetFreeBlocks() uint64 {
	if x != nil {
		return x.FreeBlocks
	}
	return 0
}

// Free: a batch of extents.
type FreeRequest struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The device; unset for device 0.
	Device *DeviceRef `protobuf:"bytes,1,opt,name=device,proto3" json:"device,omitempty"`
	// Extents to free: 1 up to the batch limit (4096), pairwise disjoint,
	// each allocated and committed (any part of an allocation or a union of
	// adjacent ones).
	Extents []*Extent `protobuf:"bytes,2,rep,name=extents,proto3" json:"extents,omitempty"`
	// As AllocateRequest.request_id.
	RequestId uint64 `protobuf:"varint,3,opt,name=request_id,json=requestId,proto3" json:"request_id,omitempty"`
	// As AllocateRequest.epoch.
	Epoch         uint64 `protobuf:"varint,4,opt,name=epoch,proto3" json:"epoch,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *FreeRequest) Reset() {
	*x = FreeRequest{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[5]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *FreeRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*FreeRequest) ProtoMessage() {}

func (x *FreeRequest) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[5]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use FreeRequest.ProtoReflect.Descriptor instead.
func (*FreeRequest) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{5}
}

func (x *FreeRequest) GetDevice() *DeviceRef {
	if x != nil {
		return x.Device
	}
	return nil
}

func (x *FreeRequest) GetExtents() []*Extent {
	if x != nil {
		return x.Extents
	}
	return nil
}

func (x *FreeRequest) GetRequestId() uint64 {
	if x != nil {
		return x.RequestId
	}
	return 0
}

func (x *FreeRequest) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

// Free's reply; durable when received.
type FreeResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// Blocks freed.
	Blocks uint64 `protobuf:"varint,1,opt,name=blocks,proto3" json:"blocks,omitempty"`
	// True when this answers a resent request id (nothing was freed again).
	Replayed bool `protobuf:"varint,2,opt,name=replayed,proto3" json:"replayed,omitempty"`
	// The device's epoch.
	Epoch uint64 `protobuf:"varint,3,opt,name=epoch,proto3" json:"epoch,omitempty"`
	// As AllocateResponse.free_blocks.
	FreeBlocks    uint64 `protobuf:"varint,4,opt,name=free_blocks,json=freeBlocks,proto3" json:"free_blocks,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *FreeResponse) Reset() {
	*x = FreeResponse{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[6]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *FreeResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*FreeResponse) ProtoMessage() {}

func (x *FreeResponse) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[6]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use FreeResponse.ProtoReflect.Descriptor instead.
func (*FreeResponse) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{6}
}

func (x *FreeResponse) GetBlocks() uint64 {
	if x != nil {
		return x.Blocks
	}
	return 0
}

func (x *FreeResponse) GetReplayed() bool {
	if x != nil {
		return x.Replayed
	}
	return false
}

func (x *FreeResponse) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

func (x *FreeResponse) GetFreeBlocks() uint64 {
	if x != nil {
		return x.FreeBlocks
	}
	return 0
}

// Status of one device or all.
type StatusRequest struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The device; unset for every device.
	Device *DeviceRef `protobuf:"bytes,1,opt,name=device,proto3" json:"device,omitempty"`
	// Also list the live leases of the requested devices.
	Leases        bool `protobuf:"varint,30,opt,name=leases,proto3" json:"leases,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *StatusRequest) Reset() {
	*x = StatusRequest{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[7]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *StatusRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*StatusRequest) ProtoMessage() {}

func (x *StatusRequest) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[7]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use StatusRequest.ProtoReflect.Descriptor instead.
func (*StatusRequest) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{7}
}

func (x *StatusRequest) GetDevice() *DeviceRef {
	if x != nil {
		return x.Device
	}
	return nil
}

func (x *StatusRequest) GetLeases() bool {
	if x != nil {
		return x.Leases
	}
	return false
}

// Space accounting of one device. Invariant:
// used_blocks + leased_unused_blocks + free_blocks == capacity_blocks.
type DeviceStatus struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The device's name (the file name of its path).
	Name string `protobuf:"bytes,1,opt,name=name,proto3" json:"name,omitempty"`
	// Its index in the server's list.
	Index uint32 `protobuf:"varint,2,opt,name=index,proto3" json:"index,omitempty"`
	// Block size in bytes.
	BlockSize uint64 `protobuf:"varint,3,opt,name=block_size,json=blockSize,proto3" json:"block_size,omitempty"`
	// Blocks on the device, metadata included.
	CapacityBlocks uint64 `protobuf:"varint,4,opt,name=capacity_blocks,json=capacityBlocks,proto3" json:"capacity_blocks,omitempty"`
	// Blocks allocated (metadata, committed allocations, and allocations of
	// calls in flight).
	UsedBlocks uint64 `protobuf:"varint,5,opt,name=used_blocks,json=usedBlocks,proto3" json:"used_blocks,omitempty"`
	// Blocks that can be allocated or leased now: free space minus the unused
	// part of every lease.
	FreeBlocks uint64 `protobuf:"varint,6,opt,name=free_blocks,json=freeBlocks,proto3" json:"free_blocks,omitempty"`
	// Blocks inside leases that their holders have not committed yet.
	LeasedUnusedBlocks uint64 `protobuf:"varint,7,opt,name=leased_unused_blocks,json=leasedUnusedBlocks,proto3" json:"leased_unused_blocks,omitempty"`
	// Live leases.
	Leases uint64 `protobuf:"varint,8,opt,name=leases,proto3" json:"leases,omitempty"`
	// Maximal runs of free blocks (leases not counted as free).
	FreeExtents uint64 `protobuf:"varint,9,opt,name=free_extents,json=freeExtents,proto3" json:"free_extents,omitempty"`
	// The longest free run, in blocks.
	LargestFreeExtent uint64 `protobuf:"varint,10,opt,name=largest_free_extent,json=largestFreeExtent,proto3" json:"largest_free_extent,omitempty"`
	// Fragmentation score in [0, 1] of the free runs: 0 when every run could
	// hold a 4 MiB object, near 1 when free space is single blocks.
	Fragmentation float64 `protobuf:"fixed64,11,opt,name=fragmentation,proto3" json:"fragmentation,omitempty"`
	// Blocks holding the store's own metadata (allocated at format).
	MetaBlocks uint64 `protobuf:"varint,12,opt,name=meta_blocks,json=metaBlocks,proto3" json:"meta_blocks,omitempty"`
	// Of leased_unused_blocks, those the holders last reported in free runs
	// of at most 1024 blocks (CommitRequest.fragment_blocks), all leases on
	// the device. The server keeps about twice their share out of any one
	// lease's reach unleased, for per-call allocation (its per_call_fragments
	// setting); a grant refused near full names the figure.
	LeasedFragmentBlocks uint64 `protobuf:"varint,13,opt,name=leased_fragment_blocks,json=leasedFragmentBlocks,proto3" json:"leased_fragment_blocks,omitempty"`
	// On a server with tenants: the caller's own entry (one at most; a
	// tenant never sees another's). Empty on an open server.
	Tenants []*TenantStatus `protobuf:"bytes,20,rep,name=tenants,proto3" json:"tenants,omitempty"`
	// On a server with tenants: the size of the regions the device is cut
	// into, in blocks (a tenant allocates only inside its own regions).
	RegionBlocks uint64 `protobuf:"varint,21,opt,name=region_blocks,json=regionBlocks,proto3" json:"region_blocks,omitempty"`
	// On a server with tenants: regions still assigned to tenants that are
	// no longer configured because they hold allocations (their empty
	// regions return to the device at start), and the blocks allocated in
	// them. Counts only; the server's log names the tenants.
	RemovedTenantRegions uint64 `protobuf:"varint,22,opt,name=removed_tenant_regions,json=removedTenantRegions,proto3" json:"removed_tenant_regions,omitempty"`
	RemovedTenantBlocks  uint64 `protobuf:"varint,23,opt,name=removed_tenant_blocks,json=removedTenantBlocks,proto3" json:"removed_tenant_blocks,omitempty"`
	// The device's owner epoch (see "Fencing" above).
	Epoch uint64 `protobuf:"varint,24,opt,name=epoch,proto3" json:"epoch,omitempty"`
	// Background zeroing of a device file's never-used space (so that
	// object writes there overwrite instead of converting unwritten
	// extents): zeroing has passed every block below zeroed_through
	// (capacity_blocks once done); 0 when the device has nothing to zero.
	ZeroedThrough uint64 `protobuf:"varint,25,opt,name=zeroed_through,json=zeroedThrough,proto3" json:"zeroed_through,omitempty"`
	// Bytes of zeros written since the server started.
	ZeroedBytes uint64 `protobuf:"varint,26,opt,name=zeroed_bytes,json=zeroedBytes,proto3" json:"zeroed_bytes,omitempty"`
	// Why background zeroing stopped before it was done; empty otherwise.
	ZeroingStopped string `protobuf:"bytes,27,opt,name=zeroing_stopped,json=zeroingStopped,proto3" json:"zeroing_stopped,omitempty"`
	unknownFields  protoimpl.UnknownFields
	sizeCache      protoimpl.SizeCache
}

func (x *DeviceStatus) Reset() {
	*x = DeviceStatus{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[8]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *DeviceStatus) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*DeviceStatus) ProtoMessage() {}

func (x *DeviceStatus) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[8]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use DeviceStatus.ProtoReflect.Descriptor instead.
func (*DeviceStatus) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{8}
}

func (x *DeviceStatus) GetName() string {
	if x != nil {
		return x.Name
	}
	return ""
}

func (x *DeviceStatus) GetIndex() uint32 {
	if x != nil {
		return x.Index
	}
	return 0
}

func (x *DeviceStatus) GetBlockSize() uint64 {
	if x != nil {
		return x.BlockSize
	}
	return 0
}

func (x *DeviceStatus) GetCapacityBlocks() uint64 {
	if x != nil {
		return x.CapacityBlocks
	}
	return 0
}

func (x *DeviceStatus) GetUsedBlocks() uint64 {
	if x != nil {
		return x.UsedBlocks
	}
	return 0
}

func (x *DeviceStatus) GetFreeBlocks() uint64 {
	if x != nil {
		return x.FreeBlocks
	}
	return 0
}

func (x *DeviceStatus) GetLeasedUnusedBlocks() uint64 {
	if x != nil {
		return x.LeasedUnusedBlocks
	}
	return 0
}

func (x *DeviceStatus) GetLeases() uint64 {
	if x != nil {
		return x.Leases
	}
	return 0
}

func (x *DeviceStatus) GetFreeExtents() uint64 {
	if x != nil {
		return x.FreeExtents
	}
	return 0
}

func (x *DeviceStatus) GetLargestFreeExtent() uint64 {
	if x != nil {
		return x.LargestFreeExtent
	}
	return 0
}

func (x *DeviceStatus) GetFragmentation() float64 {
	if x != nil {
		return x.Fragmentation
	}
	return 0
}

func (x *DeviceStatus) GetMetaBlocks() uint64 {
	if x != nil {
		return x.MetaBlocks
	}
	return 0
}

func (x *DeviceStatus) GetLeasedFragmentBlocks() uint64 {
	if x != nil {
		return x.LeasedFragmentBlocks
	}
	return 0
}

func (x *DeviceStatus) GetTenants() []*TenantStatus {
	if x != nil {
		return x.Tenants
	}
	return nil
}

func (x *DeviceStatus) GetRegionBlocks() uint64 {
	if x != nil {
		return x.RegionBlocks
	}
	return 0
}

func (x *DeviceStatus) GetRemovedTenantRegions() uint64 {
	if x != nil {
		return x.RemovedTenantRegions
	}
	return 0
}

func (x *DeviceStatus) GetRemovedTenantBlocks() uint64 {
	if x != nil {
		return x.RemovedTenantBlocks
	}
	return 0
}

func (x *DeviceStatus) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

func (x *DeviceStatus) GetZeroedThrough() uint64 {
	if x != nil {
		return x.ZeroedThrough
	}
	return 0
}

func (x *DeviceStatus) GetZeroedBytes() uint64 {
	if x != nil {
		return x.ZeroedBytes
	}
	return 0
}

func (x *DeviceStatus) GetZeroingStopped() string {
	if x != nil {
		return x.ZeroingStopped
	}
	return ""
}

// One tenant's space on one device. Quotas are charged when space is
// leased, not when it is committed: used_blocks + leased_unused_blocks is
// what counts against quota_blocks.
type TenantStatus struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The tenant's name.
	Name string `protobuf:"bytes,1,opt,name=name,proto3" json:"name,omitempty"`
	// Blocks allocated by the tenant (committed, or in calls in flight).
	UsedBlocks uint64 `protobuf:"varint,2,opt,name=used_blocks,json=usedBlocks,proto3" json:"used_blocks,omitempty"`
	// Blocks in the tenant's live leases not committed yet.
	LeasedUnusedBlocks uint64 `protobuf:"varint,3,opt,name=leased_unused_blocks,json=leasedUnusedBlocks,proto3" json:"leased_unused_blocks,omitempty"`
	// The tenant's quota on this device in blocks; 0 for no quota.
	QuotaBlocks uint64 `protobuf:"varint,4,opt,name=quota_blocks,json=quotaBlocks,proto3" json:"quota_blocks,omitempty"`
	// Regions of the device assigned to the tenant.
	Regions uint64 `protobuf:"varint,5,opt,name=regions,proto3" json:"regions,omitempty"`
	// Free blocks inside the tenant's regions, outside its leases.
	FreeBlocks    uint64 `protobuf:"varint,6,opt,name=free_blocks,json=freeBlocks,proto3" json:"free_blocks,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *TenantStatus) Reset() {
	*x = TenantStatus{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[9]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *TenantStatus) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*TenantStatus) ProtoMessage() {}

func (x *TenantStatus) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[9]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use TenantStatus.ProtoReflect.Descriptor instead.
func (*TenantStatus) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{9}
}

func (x *TenantStatus) GetName() string {
	if x != nil {
		return x.Name
	}
	return ""
}

func (x *TenantStatus) GetUsedBlocks() uint64 {
	if x != nil {
		return x.UsedBlocks
	}
	return 0
}

func (x *TenantStatus) GetLeasedUnusedBlocks() uint64 {
	if x != nil {
		return x.LeasedUnusedBlocks
	}
	return 0
}

func (x *TenantStatus) GetQuotaBlocks() uint64 {
	if x != nil {
		return x.QuotaBlocks
	}
	return 0
}

func (x *TenantStatus) GetRegions() uint64 {
	if x != nil {
		return x.Regions
	}
	return 0
}

func (x *TenantStatus) GetFreeBlocks() uint64 {
	if x != nil {
		return x.FreeBlocks
	}
	return 0
}

// Status's reply.
type StatusResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// One entry per requested device, in index order.
	Devices []*DeviceStatus `protobuf:"bytes,1,rep,name=devices,proto3" json:"devices,omitempty"`
	// CPU time (user + system) the server process has used since it started,
	// in nanoseconds: its growth over a run divided by the operations served
	// is the server's CPU per operation.
	ServerCpuNs uint64 `protobuf:"varint,2,opt,name=server_cpu_ns,json=serverCpuNs,proto3" json:"server_cpu_ns,omitempty"`
	// With StatusRequest.leases: the live leases on those devices, oldest
	// first.
	Leases        []*LeaseStatus `protobuf:"bytes,30,rep,name=leases,proto3" json:"leases,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *StatusResponse) Reset() {
	*x = StatusResponse{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[10]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *StatusResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*StatusResponse) ProtoMessage() {}

func (x *StatusResponse) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[10]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use StatusResponse.ProtoReflect.Descriptor instead.
func (*StatusResponse) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{10}
}

func (x *StatusResponse) GetDevices() []*DeviceStatus {
	if x != nil {
		return x.Devices
	}
	return nil
}

func (x *StatusResponse) GetServerCpuNs() uint64 {
	if x != nil {
		return x.ServerCpuNs
	}
	return 0
}

func (x *StatusResponse) GetLeases() []*LeaseStatus {
	if x != nil {
		return x.Leases
	}
	return nil
}

// One live lease, as an operator sees it.
type LeaseStatus struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The lease's id.
	LeaseId uint64 `protobuf:"varint,1,opt,name=lease_id,json=leaseId,proto3" json:"lease_id,omitempty"`
	// The holder's client_id (from LeaseRequest).
	ClientId string `protobuf:"bytes,2,opt,name=client_id,json=clientId,proto3" json:"client_id,omitempty"`
	// The device's index and name.
	DeviceIndex uint32 `protobuf:"varint,3,opt,name=device_index,json=deviceIndex,proto3" json:"device_index,omitempty"`
	DeviceName  string `protobuf:"bytes,4,opt,name=device_name,json=deviceName,proto3" json:"device_name,omitempty"`
	// Blocks granted, and the part not committed yet.
	GrantedBlocks uint64 `protobuf:"varint,5,opt,name=granted_blocks,json=grantedBlocks,proto3" json:"granted_blocks,omitempty"`
	UnusedBlocks  uint64 `protobuf:"varint,6,opt,name=unused_blocks,json=unusedBlocks,proto3" json:"unused_blocks,omitempty"`
	// Milliseconds since the grant.
	AgeMs uint64 `protobuf:"varint,7,opt,name=age_ms,json=ageMs,proto3" json:"age_ms,omitempty"`
	// Milliseconds until it expires unless renewed or committed (0 when due).
	ExpiresInMs   uint64 `protobuf:"varint,8,opt,name=expires_in_ms,json=expiresInMs,proto3" json:"expires_in_ms,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *LeaseStatus) Reset() {
	*x = LeaseStatus{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[11]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *LeaseStatus) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*LeaseStatus) ProtoMessage() {}

func (x *LeaseStatus) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[11]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use LeaseStatus.ProtoReflect.Descriptor instead.
func (*LeaseStatus) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{11}
}

func (x *LeaseStatus) GetLeaseId() uint64 {
	if x != nil {
		return x.LeaseId
	}
	return 0
}

func (x *LeaseStatus) GetClientId() string {
	if x != nil {
		return x.ClientId
	}
	return ""
}

func (x *LeaseStatus) GetDeviceIndex() uint32 {
	if x != nil {
		return x.DeviceIndex
	}
	return 0
}

func (x *LeaseStatus) GetDeviceName() string {
	if x != nil {
		return x.DeviceName
	}
	return ""
}

func (x *LeaseStatus) GetGrantedBlocks() uint64 {
	if x != nil {
		return x.GrantedBlocks
	}
	return 0
}

func (x *LeaseStatus) GetUnusedBlocks() uint64 {
	if x != nil {
		return x.UnusedBlocks
	}
	return 0
}

func (x *LeaseStatus) GetAgeMs() uint64 {
	if x != nil {
		return x.AgeMs
	}
	return 0
}

func (x *LeaseStatus) GetExpiresInMs() uint64 {
	if x != nil {
		return x.ExpiresInMs
	}
	return 0
}

// Lease: ask for a region of free space.
type LeaseRequest struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The device; unset for device 0.
	Device *DeviceRef `protobuf:"bytes,1,opt,name=device,proto3" json:"device,omitempty"`
	// Who asks: a stable id per client process (any string up to 128 bytes).
	// The server grows the lease size for clients that use their leases up
	// quickly.
	ClientId string `protobuf:"bytes,2,opt,name=client_id,json=clientId,proto3" json:"client_id,omitempty"`
	// The smallest useful grant, in blocks (e.g. the largest object the
	// client allocates); at least 1.
	MinBlocks uint64 `protobuf:"varint,3,opt,name=min_blocks,json=minBlocks,proto3" json:"min_blocks,omitempty"`
	// The grant the client would like, in blocks; 0 lets the server choose
	// from the client's rate. The server may grant less, never less than
	// min_blocks.
	WantBlocks uint64 `protobuf:"varint,4,opt,name=want_blocks,json=wantBlocks,proto3" json:"want_blocks,omitempty"`
	// A block to lease at or near; at most the device's block count.
	Hint *uint64 `protobuf:"varint,5,opt,name=hint,proto3,oneof" json:"hint,omitempty"`
	// When nonzero, a live lease of the caller on the same device: the
	// granted space is added to that lease (one TTL, one unused remainder,
	// one Release) instead of starting a new one, so a client that keeps one
	// lease never strands the tail of an old one. The reply's lease_id is
	// this id and its extents are only the added space. An unknown or ended
	// lease is FAILED_PRECONDITION (take a new lease); another tenant's is
	// PERMISSION_DENIED; a lease on another device is INVALID_ARGUMENT.
	ExtendLeaseId uint64 `protobuf:"varint,6,opt,name=extend_lease_id,json=extendLeaseId,proto3" json:"extend_lease_id,omitempty"`
	// As AllocateRequest.epoch.
	Epoch         uint64 `protobuf:"varint,7,opt,name=epoch,proto3" json:"epoch,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *LeaseRequest) Reset() {
	*x = LeaseRequest{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[12]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *LeaseRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*LeaseRequest) ProtoMessage() {}

func (x *LeaseRequest) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[12]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use LeaseRequest.ProtoReflect.Descriptor instead.
func (*LeaseRequest) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{12}
}

func (x *LeaseRequest) GetDevice() *DeviceRef {
	if x != nil {
		return x.Device
	}
	return nil
}

func (x *LeaseRequest) GetClientId() string {
	if x != nil {
		return x.ClientId
	}
	return ""
}

func (x *LeaseRequest) GetMinBlocks() uint64 {
	if x != nil {
		return x.MinBlocks
	}
	return 0
}

func (x *LeaseRequest) GetWantBlocks() uint64 {
	if x != nil {
		return x.WantBlocks
	}
	return 0
}

func (x *LeaseRequest) GetHint() uint64 {
	if x != nil && x.Hint != nil {
		return *x.Hint
	}
	return 0
}

func (x *LeaseRequest) GetExtendLeaseId() uint64 {
	if x != nil {
		return x.ExtendLeaseId
	}
	return 0
}

func (x *LeaseRequest) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

// Lease's reply.
type LeaseResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The lease's id, unique within this server run.
	LeaseId uint64 `protobuf:"varint,1,opt,name=lease_id,json=leaseId,proto3" json:"lease_id,omitempty"`
	// The granted region (one extent today; clients must accept several).
	Extents []*Extent `protobuf:"bytes,2,rep,name=extents,proto3" json:"extents,omitempty"`
	// Milliseconds until the lease expires unless renewed.
	TtlMs uint64 `protobuf:"varint,3,opt,name=ttl_ms,json=ttlMs,proto3" json:"ttl_ms,omitempty"`
	// The device's block size in bytes.
	BlockSize uint64 `protobuf:"varint,4,opt,name=block_size,json=blockSize,proto3" json:"block_size,omitempty"`
	// The device's block count (so that a client can build a local
	// allocator over the device's address space).
	CapacityBlocks uint64 `protobuf:"varint,5,opt,name=capacity_blocks,json=capacityBlocks,proto3" json:"capacity_blocks,omitempty"`
	// The device's index.
	DeviceIndex uint32 `protobuf:"varint,6,opt,name=device_index,json=deviceIndex,proto3" json:"device_index,omitempty"`
	// Blocks a further grant to this client (a Lease or an extension) could
	// come from when the server replied: the unleased free space within the
	// caller's reach above the part kept for per-call allocation near full;
	// 0 while no lease would be granted (a recall runs, or the device is that
	// full). Advisory: a grant may still be refused. A client's local
	// allocator counts these blocks as long runs it can add to its lease, so
	// that it asks for more space rather than cut slivers from fragments
	// that an allocator over the whole device would keep for exact fits.
	GrantableBlocks uint64 `protobuf:"varint,7,opt,name=grantable_blocks,json=grantableBlocks,proto3" json:"grantable_blocks,omitempty"`
	// The device's epoch.
	Epoch uint64 `protobuf:"varint,8,opt,name=epoch,proto3" json:"epoch,omitempty"`
	// The margin, in milliseconds, a client subtracts from ttl_ms for its
	// deadline (see "The writer's rule" above); the server keeps an expired
	// lease's space out of use for as long.
	MarginMs      uint64 `protobuf:"varint,9,opt,name=margin_ms,json=marginMs,proto3" json:"margin_ms,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *LeaseResponse) Reset() {
	*x = LeaseResponse{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[13]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *LeaseResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*LeaseResponse) ProtoMessage() {}

func (x *LeaseResponse) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[13]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use LeaseResponse.ProtoReflect.Descriptor instead.
func (*LeaseResponse) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{13}
}

func (x *LeaseResponse) GetLeaseId() uint64 {
	if x != nil {
		return x.LeaseId
	}
	return 0
}

func (x *LeaseResponse) GetExtents() []*Extent {
	if x != nil {
		return x.Extents
	}
	return nil
}

func (x *LeaseResponse) GetTtlMs() uint64 {
	if x != nil {
		return x.TtlMs
	}
	return 0
}

func (x *LeaseResponse) GetBlockSize() uint64 {
	if x != nil {
		return x.BlockSize
	}
	return 0
}

func (x *LeaseResponse) GetCapacityBlocks() uint64 {
	if x != nil {
		return x.CapacityBlocks
	}
	return 0
}

func (x *LeaseResponse) GetDeviceIndex() uint32 {
	if x != nil {
		return x.DeviceIndex
	}
	return 0
}

func (x *LeaseResponse) GetGrantableBlocks() uint64 {
	if x != nil {
		return x.GrantableBlocks
	}
	return 0
}

func (x *LeaseResponse) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

func (x *LeaseResponse) GetMarginMs() uint64 {
	if x != nil {
		return x.MarginMs
	}
	return 0
}

// Commit: publish allocations made inside a lease, and free extents.
type CommitRequest struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The lease the allocations come from.
	LeaseId uint64 `protobuf:"varint,1,opt,name=lease_id,json=leaseId,proto3" json:"lease_id,omitempty"`
	// 1 for the first commit of a lease, then one more for each commit.
	Sequence uint64 `protobuf:"varint,2,opt,name=sequence,proto3" json:"sequence,omitempty"`
	// Extents allocated inside the lease's unused part, pairwise disjoint.
	Allocations []*Extent `protobuf:"bytes,3,rep,name=allocations,proto3" json:"allocations,omitempty"`
	// Committed extents of the lease's device to free (not necessarily from
	// this lease), pairwise disjoint.
	Frees []*Extent `protobuf:"bytes,4,rep,name=frees,proto3" json:"frees,omitempty"`
	// When true, the blocks this commit frees are added to the lease once
	// the free is durable (unless a recall is in progress) and listed in
	// CommitResponse.recycled: the client reuses them locally, as an
	// in-process allocator reuses freed space, instead of leaving holes that
	// only per-call allocation can fill. They count as the lease's unused
	// part from then on.
	RecycleFrees bool `protobuf:"varint,5,opt,name=recycle_frees,json=recycleFrees,proto3" json:"recycle_frees,omitempty"`
	// Advisory: how many of the lease's unused blocks the client's allocator
	// holds in free runs of at most 1024 blocks (fragments only requests of
	// about their size can use), counted before this commit. The server
	// keeps at least the fragments of all leases as unleased free space for
	// per-call allocation, so that one allocator places them after a recall
	// while long runs remain. 0 (unset) reports none; a value above the
	// lease's unused blocks counts as that many.
	FragmentBlocks uint64 `protobuf:"varint,6,opt,name=fragment_blocks,json=fragmentBlocks,proto3" json:"fragment_blocks,omitempty"`
	// As AllocateRequest.epoch.
	Epoch         uint64 `protobuf:"varint,7,opt,name=epoch,proto3" json:"epoch,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *CommitRequest) Reset() {
	*x = CommitRequest{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[14]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *CommitRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*CommitRequest) ProtoMessage() {}

func (x *CommitRequest) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[14]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use CommitRequest.ProtoReflect.Descriptor instead.
func (*CommitRequest) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{14}
}

func (x *CommitRequest) GetLeaseId() uint64 {
	if x != nil {
		return x.LeaseId
	}
	return 0
}

func (x *CommitRequest) GetSequence() uint64 {
	if x != nil {
		return x.Sequence
	}
	return 0
}

func (x *CommitRequest) GetAllocations() []*Extent {
	if x != nil {
		return x.Allocations
	}
	return nil
}

func (x *CommitRequest) GetFrees() []*Extent {
	if x != nil {
		return x.Frees
	}
	return nil
}

func (x *CommitRequest) GetRecycleFrees() bool {
	if x != nil {
		return x.RecycleFrees
	}
	return false
}

func (x *CommitRequest) GetFragmentBlocks() uint64 {
	if x != nil {
		return x.FragmentBlocks
	}
	return 0
}

func (x *CommitRequest) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

// Commit's reply; durable when received.
type CommitResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// Blocks of the lease still unused after this commit.
	UnusedBlocks uint64 `protobuf:"varint,1,opt,name=unused_blocks,json=unusedBlocks,proto3" json:"unused_blocks,omitempty"`
	// True when this reply answers a resent sequence (nothing was applied
	// again).
	Replayed bool `protobuf:"varint,2,opt,name=replayed,proto3" json:"replayed,omitempty"`
	// True when the server asks for the lease back: a grant was refused for
	// want of space, so commit what was allocated and Release the rest now
	// (the same recall as RenewResponse.recall, delivered sooner).
	Recall bool `protobuf:"varint,3,opt,name=recall,proto3" json:"recall,omitempty"`
	// With CommitRequest.recycle_frees: the freed blocks added to the
	// lease, in address order (the same list when the reply is replayed).
	Recycled []*Extent `protobuf:"bytes,4,rep,name=recycled,proto3" json:"recycled,omitempty"`
	// As LeaseResponse.grantable_blocks, when the server replied.
	GrantableBlocks uint64 `protobuf:"varint,5,opt,name=grantable_blocks,json=grantableBlocks,proto3" json:"grantable_blocks,omitempty"`
	// The device's epoch.
	Epoch uint64 `protobuf:"varint,6,opt,name=epoch,proto3" json:"epoch,omitempty"`
	// A commit keeps the lease alive as a Renew does: milliseconds until it
	// expires unless renewed again, and the margin (as in LeaseResponse).
	TtlMs         uint64 `protobuf:"varint,7,opt,name=ttl_ms,json=ttlMs,proto3" json:"ttl_ms,omitempty"`
	MarginMs      uint64 `protobuf:"varint,8,opt,name=margin_ms,json=marginMs,proto3" json:"margin_ms,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *CommitResponse) Reset() {
	*x = CommitResponse{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[15]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *CommitResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*CommitResponse) ProtoMessage() {}

func (x *CommitResponse) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[15]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use CommitResponse.ProtoReflect.Descriptor instead.
func (*CommitResponse) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{15}
}

func (x *CommitResponse) GetUnusedBlocks() uint64 {
	if x != nil {
		return x.UnusedBlocks
	}
	return 0
}

func (x *CommitResponse) GetReplayed() bool {
	if x != nil {
		return x.Replayed
	}
	return false
}

func (x *CommitResponse) GetRecall() bool {
	if x != nil {
		return x.Recall
	}
	return false
}

func (x *CommitResponse) GetRecycled() []*Extent {
	if x != nil {
		return x.Recycled
	}
	return nil
}

func (x *CommitResponse) GetGrantableBlocks() uint64 {
	if x != nil {
		return x.GrantableBlocks
	}
	return 0
}

func (x *CommitResponse) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

func (x *CommitResponse) GetTtlMs() uint64 {
	if x != nil {
		return x.TtlMs
	}
	return 0
}

func (x *CommitResponse) GetMarginMs() uint64 {
	if x != nil {
		return x.MarginMs
	}
	return 0
}

// Renew: keep a lease alive.
type RenewRequest struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The lease.
	LeaseId uint64 `protobuf:"varint,1,opt,name=lease_id,json=leaseId,proto3" json:"lease_id,omitempty"`
	// As CommitRequest.fragment_blocks.
	FragmentBlocks uint64 `protobuf:"varint,2,opt,name=fragment_blocks,json=fragmentBlocks,proto3" json:"fragment_blocks,omitempty"`
	// As AllocateRequest.epoch.
	Epoch         uint64 `protobuf:"varint,3,opt,name=epoch,proto3" json:"epoch,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *RenewRequest) Reset() {
	*x = RenewRequest{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[16]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *RenewRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*RenewRequest) ProtoMessage() {}

func (x *RenewRequest) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[16]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use RenewRequest.ProtoReflect.Descriptor instead.
func (*RenewRequest) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{16}
}

func (x *RenewRequest) GetLeaseId() uint64 {
	if x != nil {
		return x.LeaseId
	}
	return 0
}

func (x *RenewRequest) GetFragmentBlocks() uint64 {
	if x != nil {
		return x.FragmentBlocks
	}
	return 0
}

func (x *RenewRequest) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

// Renew's reply.
type RenewResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// Milliseconds until the lease expires unless renewed again.
	TtlMs uint64 `protobuf:"varint,1,opt,name=ttl_ms,json=ttlMs,proto3" json:"ttl_ms,omitempty"`
	// True when the server asks for the lease back: the device is nearly
	// full, so commit what was allocated and Release the rest soon.
	Recall bool `protobuf:"varint,2,opt,name=recall,proto3" json:"recall,omitempty"`
	// Blocks of the lease not committed yet.
	UnusedBlocks uint64 `protobuf:"varint,3,opt,name=unused_blocks,json=unusedBlocks,proto3" json:"unused_blocks,omitempty"`
	// As LeaseResponse.grantable_blocks, when the server replied.
	GrantableBlocks uint64 `protobuf:"varint,4,opt,name=grantable_blocks,json=grantableBlocks,proto3" json:"grantable_blocks,omitempty"`
	// The device's epoch.
	Epoch uint64 `protobuf:"varint,5,opt,name=epoch,proto3" json:"epoch,omitempty"`
	// As LeaseResponse.margin_ms.
	MarginMs      uint64 `protobuf:"varint,6,opt,name=margin_ms,json=marginMs,proto3" json:"margin_ms,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *RenewResponse) Reset() {
	*x = RenewResponse{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[17]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *RenewResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*RenewResponse) ProtoMessage() {}

func (x *RenewResponse) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[17]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use RenewResponse.ProtoReflect.Descriptor instead.
func (*RenewResponse) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{17}
}

func (x *RenewResponse) GetTtlMs() uint64 {
	if x != nil {
		return x.TtlMs
	}
	return 0
}

func (x *RenewResponse) GetRecall() bool {
	if x != nil {
		return x.Recall
	}
	return false
}

func (x *RenewResponse) GetUnusedBlocks() uint64 {
	if x != nil {
		return x.UnusedBlocks
	}
	return 0
}

func (x *RenewResponse) GetGrantableBlocks() uint64 {
	if x != nil {
		return x.GrantableBlocks
	}
	return 0
}

func (x *RenewResponse) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

func (x *RenewResponse) GetMarginMs() uint64 {
	if x != nil {
		return x.MarginMs
	}
	return 0
}

// Release: end a lease.
type ReleaseRequest struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The lease.
	LeaseId uint64 `protobuf:"varint,1,opt,name=lease_id,json=leaseId,proto3" json:"lease_id,omitempty"`
	// As AllocateRequest.epoch.
	Epoch         uint64 `protobuf:"varint,2,opt,name=epoch,proto3" json:"epoch,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *ReleaseRequest) Reset() {
	*x = ReleaseRequest{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[18]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *ReleaseRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*ReleaseRequest) ProtoMessage() {}

func (x *ReleaseRequest) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[18]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use ReleaseRequest.ProtoReflect.Descriptor instead.
func (*ReleaseRequest) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{18}
}

func (x *ReleaseRequest) GetLeaseId() uint64 {
	if x != nil {
		return x.LeaseId
	}
	return 0
}

func (x *ReleaseRequest) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

// Release's reply.
type ReleaseResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// Blocks returned to free space.
	ReleasedBlocks uint64 `protobuf:"varint,1,opt,name=released_blocks,json=releasedBlocks,proto3" json:"released_blocks,omitempty"`
	// The device's epoch.
	Epoch         uint64 `protobuf:"varint,2,opt,name=epoch,proto3" json:"epoch,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *ReleaseResponse) Reset() {
	*x = ReleaseResponse{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[19]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *ReleaseResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*ReleaseResponse) ProtoMessage() {}

func (x *ReleaseResponse) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[19]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use ReleaseResponse.ProtoReflect.Descriptor instead.
func (*ReleaseResponse) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{19}
}

func (x *ReleaseResponse) GetReleasedBlocks() uint64 {
	if x != nil {
		return x.ReleasedBlocks
	}
	return 0
}

func (x *ReleaseResponse) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

// WatchRecalls: follow a device's recalls.
type WatchRecallsRequest struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The device.
	Device        *DeviceRef `protobuf:"bytes,1,opt,name=device,proto3" json:"device,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *WatchRecallsRequest) Reset() {
	*x = WatchRecallsRequest{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[20]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *WatchRecallsRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*WatchRecallsRequest) ProtoMessage() {}

func (x *WatchRecallsRequest) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[20]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use WatchRecallsRequest.ProtoReflect.Descriptor instead.
func (*WatchRecallsRequest) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{20}
}

func (x *WatchRecallsRequest) GetDevice() *DeviceRef {
	if x != nil {
		return x.Device
	}
	return nil
}

// One message of the WatchRecalls stream.
type RecallEvent struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The device's index.
	DeviceIndex uint32 `protobuf:"varint,1,opt,name=device_index,json=deviceIndex,proto3" json:"device_index,omitempty"`
	// True while a recall is in progress on the device: commit what was
	// allocated in leases on it and Release their unused rest.
	Recall        bool `protobuf:"varint,2,opt,name=recall,proto3" json:"recall,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *RecallEvent) Reset() {
	*x = RecallEvent{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[21]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *RecallEvent) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*RecallEvent) ProtoMessage() {}

func (x *RecallEvent) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[21]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use RecallEvent.ProtoReflect.Descriptor instead.
func (*RecallEvent) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{21}
}

func (x *RecallEvent) GetDeviceIndex() uint32 {
	if x != nil {
		return x.DeviceIndex
	}
	return 0
}

func (x *RecallEvent) GetRecall() bool {
	if x != nil {
		return x.Recall
	}
	return false
}

// One call on a `Calls` stream.
type CallRequest struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// Chosen by the client; its reply carries it back. Ids need not be
	// unique, but a client that reuses one cannot tell the replies apart.
	// Id 0 is the server's stop notice: a client's ids start at 1.
	Id uint64 `protobuf:"varint,1,opt,name=id,proto3" json:"id,omitempty"`
	// The call; a message with none gets an INVALID_ARGUMENT error reply.
	//
	// Types that are valid to be assigned to Call:
	//
	//	*CallRequest_Allocate
	//	*CallRequest_Free
	//	*CallRequest_Commit
	Call          isCallRequest_Call `protobuf_oneof:"call"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *CallRequest) Reset() {
	*x = CallRequest{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[22]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *CallRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*CallRequest) ProtoMessage() {}

func (x *CallRequest) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[22]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use CallRequest.ProtoReflect.Descriptor instead.
func (*CallRequest) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{22}
}

func (x *CallRequest) GetId() uint64 {
	if x != nil {
		return x.Id
	}
	return 0
}

func (x *CallRequest) GetCall() isCallRequest_Call {
	if x != nil {
		return x.Call
	}
	return nil
}

func (x *CallRequest) GetAllocate() *AllocateRequest {
	if x != nil {
		if x, ok := x.Call.(*CallRequest_Allocate); ok {
			return x.Allocate
		}
	}
	return nil
}

func (x *CallRequest) GetFree() *FreeRequest {
	if x != nil {
		if x, ok := x.Call.(*CallRequest_Free); ok {
			return x.Free
		}
	}
	return nil
}

func (x *CallRequest) GetCommit() *CommitRequest {
	if x != nil {
		if x, ok := x.Call.(*CallRequest_Commit); ok {
			return x.Commit
		}
	}
	return nil
}

type isCallRequest_Call interface {
	isCallRequest_Call()
}

type CallRequest_Allocate struct {
	Allocate *AllocateRequest `protobuf:"bytes,2,opt,name=allocate,proto3,oneof"`
}

type CallRequest_Free struct {
	Free *FreeRequest `protobuf:"bytes,3,opt,name=free,proto3,oneof"`
}

type CallRequest_Commit struct {
	// A lease's commit: idempotent per (lease, sequence) as the unary
	// Commit is, so a client that lost the stream before the reply sends
	// it again, on the stream or unary.
	Commit *CommitRequest `protobuf:"bytes,4,opt,name=commit,proto3,oneof"`
}

func (*CallRequest_Allocate) isCallRequest_Call() {}

func (*CallRequest_Free) isCallRequest_Call() {}

func (*CallRequest_Commit) isCallRequest_Call() {}

// The reply to one call of a `Calls` stream.
type CallReply struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The id of the request it answers; 0 for the stop notice (see `Calls`).
	Id uint64 `protobuf:"varint,1,opt,name=id,proto3" json:"id,omitempty"`
	// What the unary call would have returned.
	//
	// Types that are valid to be assigned to Result:
	//
	//	*CallReply_Allocate
	//	*CallReply_Free
	//	*CallReply_Error
	//	*CallReply_Commit
	Result        isCallReply_Result `protobuf_oneof:"result"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *CallReply) Reset() {
	*x = CallReply{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[23]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *CallReply) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*CallReply) ProtoMessage() {}

func (x *CallReply) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[23]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use CallReply.ProtoReflect.Descriptor instead.
func (*CallReply) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{23}
}

func (x *CallReply) GetId() uint64 {
	if x != nil {
		return x.Id
	}
	return 0
}

func (x *CallReply) GetResult() isCallReply_Result {
	if x != nil {
		return x.Result
	}
	return nil
}

func (x *CallReply) GetAllocate() *AllocateResponse {
	if x != nil {
		if x, ok := x.Result.(*CallReply_Allocate); ok {
			return x.Allocate
		}
	}
	return nil
}

func (x *CallReply) GetFree() *FreeResponse {
	if x != nil {
		if x, ok := x.Result.(*CallReply_Free); ok {
			return x.Free
		}
	}
	return nil
}

func (x *CallReply) GetError() *CallError {
	if x != nil {
		if x, ok := x.Result.(*CallReply_Error); ok {
			return x.Error
		}
	}
	return nil
}

func (x *CallReply) GetCommit() *CommitResponse {
	if x != nil {
		if x, ok := x.Result.(*CallReply_Commit); ok {
			return x.Commit
		}
	}
	return nil
}

type isCallReply_Result interface {
	isCallReply_Result()
}

type CallReply_Allocate struct {
	Allocate *AllocateResponse `protobuf:"bytes,2,opt,name=allocate,proto3,oneof"`
}

type CallReply_Free struct {
	Free *FreeResponse `protobuf:"bytes,3,opt,name=free,proto3,oneof"`
}

type CallReply_Error struct {
	Error *CallError `protobuf:"bytes,4,opt,name=error,proto3,oneof"`
}

type CallReply_Commit struct {
	Commit *CommitResponse `protobuf:"bytes,5,opt,name=commit,proto3,oneof"`
}

func (*CallReply_Allocate) isCallReply_Result() {}

func (*CallReply_Free) isCallReply_Result() {}

func (*CallReply_Error) isCallReply_Result() {}

func (*CallReply_Commit) isCallReply_Result() {}

// A call's failure: the gRPC status the unary call would have ended with.
type CallError struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The gRPC status code (google.rpc.Code numbering: 3 INVALID_ARGUMENT,
	// 8 RESOURCE_EXHAUSTED, 9 FAILED_PRECONDITION...).
	Code int32 `protobuf:"varint,1,opt,name=code,proto3" json:"code,omitempty"`
	// Why, for a person.
	Message string `protobuf:"bytes,2,opt,name=message,proto3" json:"message,omitempty"`
	// With RESOURCE_EXHAUSTED when the device had no free run for an object:
	// the device at that moment (what a unary call's status details carry).
	NoSpace *NoSpaceDetails `protobuf:"bytes,3,opt,name=no_space,json=noSpace,proto3" json:"no_space,omitempty"`
	// With RESOURCE_EXHAUSTED when the call would take the caller's tenant
	// past its quota: the quota (what a unary call's status details carry).
	Quota         *QuotaDetails `protobuf:"bytes,4,opt,name=quota,proto3" json:"quota,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *CallError) Reset() {
	*x = CallError{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[24]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *CallError) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*CallError) ProtoMessage() {}

func (x *CallError) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[24]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use CallError.ProtoReflect.Descriptor instead.
func (*CallError) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{24}
}

func (x *CallError) GetCode() int32 {
	if x != nil {
		return x.Code
	}
	return 0
}

func (x *CallError) GetMessage() string {
	if x != nil {
		return x.Message
	}
	return ""
}

func (x *CallError) GetNoSpace() *NoSpaceDetails {
	if x != nil {
		return x.NoSpace
	}
	return nil
}

func (x *CallError) GetQuota() *QuotaDetails {
	if x != nil {
		return x.Quota
	}
	return nil
}

// The device when it refused an allocation for want of a free run, read in
// the same step as the refusal. Later calls (a Status, say) may already see
// frees or released leases that came after it.
type NoSpaceDetails struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The blocks the refused object needed: in one run, or in all its
	// extents for a scattered allocation.
	RequestedBlocks uint64 `protobuf:"varint,1,opt,name=requested_blocks,json=requestedBlocks,proto3" json:"requested_blocks,omitempty"`
	// Free blocks outside every lease.
	FreeBlocks uint64 `protobuf:"varint,2,opt,name=free_blocks,json=freeBlocks,proto3" json:"free_blocks,omitempty"`
	// The longest free run, in blocks (shorter than requested_blocks for a
	// contiguous object).
	LargestFreeExtent uint64 `protobuf:"varint,3,opt,name=largest_free_extent,json=largestFreeExtent,proto3" json:"largest_free_extent,omitempty"`
	// Blocks allocated: metadata, committed allocations and the allocations
	// of calls in flight (DeviceStatus.used_blocks then).
	UsedBlocks uint64 `protobuf:"varint,4,opt,name=used_blocks,json=usedBlocks,proto3" json:"used_blocks,omitempty"`
	// Blocks inside leases that their holders had not committed
	// (DeviceStatus.leased_unused_blocks then). While leases hold unused
	// space the server recalls them and refuses only once they are back or
	// one TTL and a margin have passed, so this is usually 0.
	LeasedUnusedBlocks uint64 `protobuf:"varint,5,opt,name=leased_unused_blocks,json=leasedUnusedBlocks,proto3" json:"leased_unused_blocks,omitempty"`
	// Blocks on the device, metadata included.
	CapacityBlocks uint64 `protobuf:"varint,6,opt,name=capacity_blocks,json=capacityBlocks,proto3" json:"capacity_blocks,omitempty"`
	unknownFields  protoimpl.UnknownFields
	sizeCache      protoimpl.SizeCache
}

func (x *NoSpaceDetails) Reset() {
	*x = NoSpaceDetails{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[25]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *NoSpaceDetails) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*NoSpaceDetails) ProtoMessage() {}

func (x *NoSpaceDetails) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[25]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use NoSpaceDetails.ProtoReflect.Descriptor instead.
func (*NoSpaceDetails) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{25}
}

func (x *NoSpaceDetails) GetRequestedBlocks() uint64 {
	if x != nil {
		return x.RequestedBlocks
	}
	return 0
}

func (x *NoSpaceDetails) GetFreeBlocks() uint64 {
	if x != nil {
		return x.FreeBlocks
	}
	return 0
}

func (x *NoSpaceDetails) GetLargestFreeExtent() uint64 {
	if x != nil {
		return x.LargestFreeExtent
	}
	return 0
}

func (x *NoSpaceDetails) GetUsedBlocks() uint64 {
	if x != nil {
		return x.UsedBlocks
	}
	return 0
}

func (x *NoSpaceDetails) GetLeasedUnusedBlocks() uint64 {
	if x != nil {
		return x.LeasedUnusedBlocks
	}
	return 0
}

func (x *NoSpaceDetails) GetCapacityBlocks() uint64 {
	if x != nil {
		return x.CapacityBlocks
	}
	return 0
}

// A refusal because the call would take the caller's tenant past its quota
// on the device (RESOURCE_EXHAUSTED): which quota, and how far. Sent in the
// status details of a unary call (google.rpc.Status,
// grpc-status-details-bin) and as CallError.quota on the Calls stream; a
// client tells a quota refusal from a device without room by it.
type QuotaDetails struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The tenant.
	Tenant string `protobuf:"bytes,1,opt,name=tenant,proto3" json:"tenant,omitempty"`
	// The device's name.
	Device string `protobuf:"bytes,2,opt,name=device,proto3" json:"device,omitempty"`
	// The tenant's quota on the device, in bytes.
	QuotaBytes uint64 `protobuf:"varint,3,opt,name=quota_bytes,json=quotaBytes,proto3" json:"quota_bytes,omitempty"`
	// Bytes the tenant held on the device: allocated, plus leased and unused.
	HeldBytes uint64 `protobuf:"varint,4,opt,name=held_bytes,json=heldBytes,proto3" json:"held_bytes,omitempty"`
	// Bytes the refused call asked for.
	AskedBytes    uint64 `protobuf:"varint,5,opt,name=asked_bytes,json=askedBytes,proto3" json:"asked_bytes,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *QuotaDetails) Reset() {
	*x = QuotaDetails{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[26]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *QuotaDetails) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*QuotaDetails) ProtoMessage() {}

func (x *QuotaDetails) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[26]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use QuotaDetails.ProtoReflect.Descriptor instead.
func (*QuotaDetails) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{26}
}

func (x *QuotaDetails) GetTenant() string {
	if x != nil {
		return x.Tenant
	}
	return ""
}

func (x *QuotaDetails) GetDevice() string {
	if x != nil {
		return x.Device
	}
	return ""
}

func (x *QuotaDetails) GetQuotaBytes() uint64 {
	if x != nil {
		return x.QuotaBytes
	}
	return 0
}

func (x *QuotaDetails) GetHeldBytes() uint64 {
	if x != nil {
		return x.HeldBytes
	}
	return 0
}

func (x *QuotaDetails) GetAskedBytes() uint64 {
	if x != nil {
		return x.AskedBytes
	}
	return 0
}

// WatchTopology's request.
type WatchTopologyRequest struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *WatchTopologyRequest) Reset() {
	*x = WatchTopologyRequest{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[27]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *WatchTopologyRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*WatchTopologyRequest) ProtoMessage() {}

func (x *WatchTopologyRequest) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[27]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use WatchTopologyRequest.ProtoReflect.Descriptor instead.
func (*WatchTopologyRequest) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{27}
}

// A cluster's topology at one etcd revision.
type Topology struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The etcd revision it was read at; it only grows.
	Revision uint64 `protobuf:"varint,1,opt,name=revision,proto3" json:"revision,omitempty"`
	// The cluster's name.
	Cluster string `protobuf:"bytes,2,opt,name=cluster,proto3" json:"cluster,omitempty"`
	// Live servers, by name.
	Servers []*ClusterServer `protobuf:"bytes,3,rep,name=servers,proto3" json:"servers,omitempty"`
	// Devices that have an owner now, by name. A device between owners (its
	// owner died, no standby took it yet) is absent.
	Devices       []*ClusterDevice `protobuf:"bytes,4,rep,name=devices,proto3" json:"devices,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *Topology) Reset() {
	*x = Topology{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[28]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *Topology) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*Topology) ProtoMessage() {}

func (x *Topology) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[28]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use Topology.ProtoReflect.Descriptor instead.
func (*Topology) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{28}
}

func (x *Topology) GetRevision() uint64 {
	if x != nil {
		return x.Revision
	}
	return 0
}

func (x *Topology) GetCluster() string {
	if x != nil {
		return x.Cluster
	}
	return ""
}

func (x *Topology) GetServers() []*ClusterServer {
	if x != nil {
		return x.Servers
	}
	return nil
}

func (x *Topology) GetDevices() []*ClusterDevice {
	if x != nil {
		return x.Devices
	}
	return nil
}

// A live server of the cluster.
type ClusterServer struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// Its name, unique in the cluster.
	Name string `protobuf:"bytes,1,opt,name=name,proto3" json:"name,omitempty"`
	// The address clients reach it at (host:port).
	Address string `protobuf:"bytes,2,opt,name=address,proto3" json:"address,omitempty"`
	// The devices it can serve (owns, or stands by for).
	Devices []string `protobuf:"bytes,3,rep,name=devices,proto3" json:"devices,omitempty"`
	// Its labels, "key=value" (for example "zone=a"), as configured.
	Labels []string `protobuf:"bytes,4,rep,name=labels,proto3" json:"labels,omitempty"`
	// Its blockalloc version.
	Version       string `protobuf:"bytes,5,opt,name=version,proto3" json:"version,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *ClusterServer) Reset() {
	*x = ClusterServer{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[29]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *ClusterServer) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*ClusterServer) ProtoMessage() {}

func (x *ClusterServer) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[29]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use ClusterServer.ProtoReflect.Descriptor instead.
func (*ClusterServer) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{29}
}

func (x *ClusterServer) GetName() string {
	if x != nil {
		return x.Name
	}
	return ""
}

func (x *ClusterServer) GetAddress() string {
	if x != nil {
		return x.Address
	}
	return ""
}

func (x *ClusterServer) GetDevices() []string {
	if x != nil {
		return x.Devices
	}
	return nil
}

func (x *ClusterServer) GetLabels() []string {
	if x != nil {
		return x.Labels
	}
	return nil
}

func (x *ClusterServer) GetVersion() string {
	if x != nil {
		return x.Version
	}
	return ""
}

// A device with an owner.
type ClusterDevice struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The device's name: unique in the cluster; DeviceRef.name on its owner.
	Name string `protobuf:"bytes,1,opt,name=name,proto3" json:"name,omitempty"`
	// The owning server's name and address.
	Server  string `protobuf:"bytes,2,opt,name=server,proto3" json:"server,omitempty"`
	Address string `protobuf:"bytes,3,opt,name=address,proto3" json:"address,omitempty"`
	// The owner's epoch of the device (its fencing token): it grows with
	// every change of owner.
	Epoch uint64 `protobuf:"varint,4,opt,name=epoch,proto3" json:"epoch,omitempty"`
	// Space as the owner last published it; `space_known` false just after a
	// takeover, before the first publication.
	SpaceKnown     bool   `protobuf:"varint,5,opt,name=space_known,json=spaceKnown,proto3" json:"space_known,omitempty"`
	BlockSize      uint64 `protobuf:"varint,6,opt,name=block_size,json=blockSize,proto3" json:"block_size,omitempty"`
	CapacityBlocks uint64 `protobuf:"varint,7,opt,name=capacity_blocks,json=capacityBlocks,proto3" json:"capacity_blocks,omitempty"`
	FreeBlocks     uint64 `protobuf:"varint,8,opt,name=free_blocks,json=freeBlocks,proto3" json:"free_blocks,omitempty"`
	LeasedBlocks   uint64 `protobuf:"varint,9,opt,name=leased_blocks,json=leasedBlocks,proto3" json:"leased_blocks,omitempty"`
	// The device's labels: its owner's, and "server=NAME".
	Labels        []string `protobuf:"bytes,10,rep,name=labels,proto3" json:"labels,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *ClusterDevice) Reset() {
	*x = ClusterDevice{}
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[30]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *ClusterDevice) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*ClusterDevice) ProtoMessage() {}

func (x *ClusterDevice) ProtoReflect() protoreflect.Message {
	mi := &file_blockalloc_v1_allocator_proto_msgTypes[30]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use ClusterDevice.ProtoReflect.Descriptor instead.
func (*ClusterDevice) Descriptor() ([]byte, []int) {
	return file_blockalloc_v1_allocator_proto_rawDescGZIP(), []int{30}
}

func (x *ClusterDevice) GetName() string {
	if x != nil {
		return x.Name
	}
	return ""
}

func (x *ClusterDevice) GetServer() string {
	if x != nil {
		return x.Server
	}
	return ""
}

func (x *ClusterDevice) GetAddress() string {
	if x != nil {
		return x.Address
	}
	return ""
}

func (x *ClusterDevice) GetEpoch() uint64 {
	if x != nil {
		return x.Epoch
	}
	return 0
}

func (x *ClusterDevice) GetSpaceKnown() bool {
	if x != nil {
		return x.SpaceKnown
	}
	return false
}

func (x *ClusterDevice) GetBlockSize() uint64 {
	if x != nil {
		return x.BlockSize
	}
	return 0
}

func (x *ClusterDevice) GetCapacityBlocks() uint64 {
	if x != nil {
		return x.CapacityBlocks
	}
	return 0
}

func (x *ClusterDevice) GetFreeBlocks() uint64 {
	if x != nil {
		return x.FreeBlocks
	}
	return 0
}

func (x *ClusterDevice) GetLeasedBlocks() uint64 {
	if x != nil {
		return x.LeasedBlocks
	}
	return 0
}

func (x *ClusterDevice) GetLabels() []string {
	if x != nil {
		return x.Labels
	}
	return nil
}

var File_blockalloc_v1_allocator_proto protoreflect.FileDescriptor

const file_blockalloc_v1_allocator_proto_rawDesc = "" +
	"\n" +
	"\x1dblockalloc/v1/allocator.proto\x12\rblockalloc.v1\"@\n" +
	"\tDeviceRef\x12\x14\n" +
	"\x04name\x18\x01 \x01(\tH\x00R\x04name\x12\x16\n" +
	"\x05index\x18\x02 \x01(\rH\x00R\x05indexB\x05\n" +
	"\x03ref\"0\n" +
	"\x06Extent\x12\x14\n" +
	"\x05start\x18\x01 \x01(\x04R\x05start\x12\x10\n" +
	"\x03len\x18\x02 \x01(\x04R\x03len\"\x88\x02\n" +
	"\x0fAllocateRequest\x120\n" +
	"\x06device\x18\x01 \x01(\v2\x18.blockalloc.v1.DeviceRefR\x06device\x12\x14\n" +
	"\x05count\x18\x02 \x01(\rR\x05count\x12\x18\n" +
	"\x06blocks\x18\x03 \x01(\x04H\x00R\x06blocks\x12\x16\n" +
	"\x05bytes\x18\x04 \x01(\x04H\x00R\x05bytes\x12\x1c\n" +
	"\tscattered\x18\x05 \x01(\bR\tscattered\x12\x17\n" +
	"\x04hint\x18\x06 \x01(\x04H\x01R\x04hint\x88\x01\x01\x12\x1d\n" +
	"\n" +
	"request_id\x18\a \x01(\x04R\trequestId\x12\x14\n" +
	"\x05epoch\x18\b \x01(\x04R\x05epochB\x06\n" +
	"\x04sizeB\a\n" +
	"\x05_hint\"9\n" +
	"\x06Object\x12/\n" +
	"\aextents\x18\x01 \x03(\v2\x15.blockalloc.v1.ExtentR\aextents\"\xb5\x01\n" +
	"\x10AllocateResponse\x12/\n" +
	"\aobjects\x18\x01 \x03(\v2\x15.blockalloc.v1.ObjectR\aobjects\x12\x1d\n" +
	"\n" +
	"block_size\x18\x02 \x01(\x04R\tblockSize\x12\x1a\n" +
	"\breplayed\x18\x03 \x01(\bR\breplayed\x12\x14\n" +
	"\x05epoch\x18\x04 \x01(\x04R\x05epoch\x12\x1f\n" +
	"\vfree_blocks\x18\x05 \x01(\x04R\n" +
	"freeBlocks\"\xa5\x01\n" +
	"\vFreeRequest\x120\n" +
	"\x06device\x18\x01 \x01(\v2\x18.blockalloc.v1.DeviceRefR\x06device\x12/\n" +
	"\aextents\x18\x02 \x03(\v2\x15.blockalloc.v1.ExtentR\aextents\x12\x1d\n" +
	"\n" +
	"request_id\x18\x03 \x01(\x04R\trequestId\x12\x14\n" +
	"\x05epoch\x18\x04 \x01(\x04R\x05epoch\"y\n" +
	"\fFreeResponse\x12\x16\n" +
	"\x06blocks\x18\x01 \x01(\x04R\x06blocks\x12\x1a\n" +
	"\breplayed\x18\x02 \x01(\bR\breplayed\x12\x14\n" +
	"\x05epoch\x18\x03 \x01(\x04R\x05epoch\x12\x1f\n" +
	"\vfree_blocks\x18\x04 \x01(\x04R\n" +
	"freeBlocks\"Y\n" +
	"\rStatusRequest\x120\n" +
	"\x06device\x18\x01 \x01(\v2\x18.blockalloc.v1.DeviceRefR\x06device\x12\x16\n" +
	"\x06leases\x18\x1e \x01(\bR\x06leases\"\xab\x06\n" +
	"\fDeviceStatus\x12\x12\n" +
	"\x04name\x18\x01 \x01(\tR\x04name\x12\x14\n" +
	"\x05index\x18\x02 \x01(\rR\x05index\x12\x1d\n" +
	"\n" +
	"block_size\x18\x03 \x01(\x04R\tblockSize\x12'\n" +
	"\x0fcapacity_blocks\x18\x04 \x01(\x04R\x0ecapacityBlocks\x12\x1f\n" +
	"\vused_blocks\x18\x05 \x01(\x04R\n" +
	"usedBlocks\x12\x1f\n" +
	"\vfree_blocks\x18\x06 \x01(\x04R\n" +
	"freeBlocks\x120\n" +
	"\x14leased_unused_blocks\x18\a \x01(\x04R\x12leasedUnusedBlocks\x12\x16\n" +
	"\x06leases\x18\b \x01(\x04R\x06leases\x12!\n" +
	"\ffree_extents\x18\t \x01(\x04R\vfreeExtents\x12.\n" +
	"\x13largest_free_extent\x18\n" +
	" \x01(\x04R\x11largestFreeExtent\x12$\n" +
	"\rfragmentation\x18\v \x01(\x01R\rfragmentation\x12\x1f\n" +
	"\vmeta_blocks\x18\f \x01(\x04R\n" +
	"metaBlocks\x124\n" +
	"\x16leased_fragment_blocks\x18\r \x01(\x04R\x14leasedFragmentBlocks\x125\n" +
	"\atenants\x18\x14 \x03(\v2\x1b.blockalloc.v1.TenantStatusR\atenants\x12#\n" +
	"\rregion_blocks\x18\x15 \x01(\x04R\fregionBlocks\x124\n" +
	"\x16removed_tenant_regions\x18\x16 \x01(\x04R\x14removedTenantRegions\x122\n" +
	"\x15removed_tenant_blocks\x18\x17 \x01(\x04R\x13removedTenantBlocks\x12\x14\n" +
	"\x05epoch\x18\x18 \x01(\x04R\x05epoch\x12%\n" +
	"\x0ezeroed_through\x18\x19 \x01(\x04R\rzeroedThrough\x12!\n" +
	"\fzeroed_bytes\x18\x1a \x01(\x04R\vzeroedBytes\x12'\n" +
	"\x0fzeroing_stopped\x18\x1b \x01(\tR\x0ezeroingStopped\"\xd3\x01\n" +
	"\fTenantStatus\x12\x12\n" +
	"\x04name\x18\x01 \x01(\tR\x04name\x12\x1f\n" +
	"\vused_blocks\x18\x02 \x01(\x04R\n" +
	"usedBlocks\x120\n" +
	"\x14leased_unused_blocks\x18\x03 \x01(\x04R\x12leasedUnusedBlocks\x12!\n" +
	"\fquota_blocks\x18\x04 \x01(\x04R\vquotaBlocks\x12\x18\n" +
	"\aregions\x18\x05 \x01(\x04R\aregions\x12\x1f\n" +
	"\vfree_blocks\x18\x06 \x01(\x04R\n" +
	"freeBlocks\"\x9f\x01\n" +
	"\x0eStatusResponse\x125\n" +
	"\adevices\x18\x01 \x03(\v2\x1b.blockalloc.v1.DeviceStatusR\adevices\x12\"\n" +
	"\rserver_cpu_ns\x18\x02 \x01(\x04R\vserverCpuNs\x122\n" +
	"\x06leases\x18\x1e \x03(\v2\x1a.blockalloc.v1.LeaseStatusR\x06leases\"\x90\x02\n" +
	"\vLeaseStatus\x12\x19\n" +
	"\blease_id\x18\x01 \x01(\x04R\aleaseId\x12\x1b\n" +
	"\tclient_id\x18\x02 \x01(\tR\bclientId\x12!\n" +
	"\fdevice_index\x18\x03 \x01(\rR\vdeviceIndex\x12\x1f\n" +
	"\vdevice_name\x18\x04 \x01(\tR\n" +
	"deviceName\x12%\n" +
	"\x0egranted_blocks\x18\x05 \x01(\x04R\rgrantedBlocks\x12#\n" +
	"\runused_blocks\x18\x06 \x01(\x04R\funusedBlocks\x12\x15\n" +
	"\x06age_ms\x18\a \x01(\x04R\x05ageMs\x12\"\n" +
	"\rexpires_in_ms\x18\b \x01(\x04R\vexpiresInMs\"\xfd\x01\n" +
	"\fLeaseRequest\x120\n" +
	"\x06device\x18\x01 \x01(\v2\x18.blockalloc.v1.DeviceRefR\x06device\x12\x1b\n" +
	"\tclient_id\x18\x02 \x01(\tR\bclientId\x12\x1d\n" +
	"\n" +
	"min_blocks\x18\x03 \x01(\x04R\tminBlocks\x12\x1f\n" +
	"\vwant_blocks\x18\x04 \x01(\x04R\n" +
	"wantBlocks\x12\x17\n" +
	"\x04hint\x18\x05 \x01(\x04H\x00R\x04hint\x88\x01\x01\x12&\n" +
	"\x0fextend_lease_id\x18\x06 \x01(\x04R\rextendLeaseId\x12\x14\n" +
	"\x05epoch\x18\a \x01(\x04R\x05epochB\a\n" +
	"\x05_hint\"\xbb\x02\n" +
	"\rLeaseResponse\x12\x19\n" +
	"\blease_id\x18\x01 \x01(\x04R\aleaseId\x12/\n" +
	"\aextents\x18\x02 \x03(\v2\x15.blockalloc.v1.ExtentR\aextents\x12\x15\n" +
	"\x06ttl_ms\x18\x03 \x01(\x04R\x05ttlMs\x12\x1d\n" +
	"\n" +
	"block_size\x18\x04 \x01(\x04R\tblockSize\x12'\n" +
	"\x0fcapacity_blocks\x18\x05 \x01(\x04R\x0ecapacityBlocks\x12!\n" +
	"\fdevice_index\x18\x06 \x01(\rR\vdeviceIndex\x12)\n" +
	"\x10grantable_blocks\x18\a \x01(\x04R\x0fgrantableBlocks\x12\x14\n" +
	"\x05epoch\x18\b \x01(\x04R\x05epoch\x12\x1b\n" +
	"\tmargin_ms\x18\t \x01(\x04R\bmarginMs\"\x90\x02\n" +
	"\rCommitRequest\x12\x19\n" +
	"\blease_id\x18\x01 \x01(\x04R\aleaseId\x12\x1a\n" +
	"\bsequence\x18\x02 \x01(\x04R\bsequence\x127\n" +
	"\vallocations\x18\x03 \x03(\v2\x15.blockalloc.v1.ExtentR\vallocations\x12+\n" +
	"\x05frees\x18\x04 \x03(\v2\x15.blockalloc.v1.ExtentR\x05frees\x12#\n" +
	"\rrecycle_frees\x18\x05 \x01(\bR\frecycleFrees\x12'\n" +
	"\x0ffragment_blocks\x18\x06 \x01(\x04R\x0efragmentBlocks\x12\x14\n" +
	"\x05epoch\x18\a \x01(\x04R\x05epoch\"\x91\x02\n" +
	"\x0eCommitResponse\x12#\n" +
	"\runused_blocks\x18\x01 \x01(\x04R\funusedBlocks\x12\x1a\n" +
	"\breplayed\x18\x02 \x01(\bR\breplayed\x12\x16\n" +
	"\x06recall\x18\x03 \x01(\bR\x06recall\x121\n" +
	"\brecycled\x18\x04 \x03(\v2\x15.blockalloc.v1.ExtentR\brecycled\x12)\n" +
	"\x10grantable_blocks\x18\x05 \x01(\x04R\x0fgrantableBlocks\x12\x14\n" +
	"\x05epoch\x18\x06 \x01(\x04R\x05epoch\x12\x15\n" +
	"\x06ttl_ms\x18\a \x01(\x04R\x05ttlMs\x12\x1b\n" +
	"\tmargin_ms\x18\b \x01(\x04R\bmarginMs\"h\n" +
	"\fRenewRequest\x12\x19\n" +
	"\blease_id\x18\x01 \x01(\x04R\aleaseId\x12'\n" +
	"\x0ffragment_blocks\x18\x02 \x01(\x04R\x0efragmentBlocks\x12\x14\n" +
	"\x05epoch\x18\x03 \x01(\x04R\x05epoch\"\xc1\x01\n" +
	"\rRenewResponse\x12\x15\n" +
	"\x06ttl_ms\x18\x01 \x01(\x04R\x05ttlMs\x12\x16\n" +
	"\x06recall\x18\x02 \x01(\bR\x06recall\x12#\n" +
	"\runused_blocks\x18\x03 \x01(\x04R\funusedBlocks\x12)\n" +
	"\x10grantable_blocks\x18\x04 \x01(\x04R\x0fgrantableBlocks\x12\x14\n" +
	"\x05epoch\x18\x05 \x01(\x04R\x05epoch\x12\x1b\n" +
	"\tmargin_ms\x18\x06 \x01(\x04R\bmarginMs\"A\n" +
	"\x0eReleaseRequest\x12\x19\n" +
	"\blease_id\x18\x01 \x01(\x04R\aleaseId\x12\x14\n" +
	"\x05epoch\x18\x02 \x01(\x04R\x05epoch\"P\n" +
	"\x0fReleaseResponse\x12'\n" +
	"\x0freleased_blocks\x18\x01 \x01(\x04R\x0ereleasedBlocks\x12\x14\n" +
	"\x05epoch\x18\x02 \x01(\x04R\x05epoch\"G\n" +
	"\x13WatchRecallsRequest\x120\n" +
	"\x06device\x18\x01 \x01(\v2\x18.blockalloc.v1.DeviceRefR\x06device\"H\n" +
	"\vRecallEvent\x12!\n" +
	"\fdevice_index\x18\x01 \x01(\rR\vdeviceIndex\x12\x16\n" +
	"\x06recall\x18\x02 \x01(\bR\x06recall\"\xcd\x01\n" +
	"\vCallRequest\x12\x0e\n" +
	"\x02id\x18\x01 \x01(\x04R\x02id\x12<\n" +
	"\ballocate\x18\x02 \x01(\v2\x1e.blockalloc.v1.AllocateRequestH\x00R\ballocate\x120\n" +
	"\x04free\x18\x03 \x01(\v2\x1a.blockalloc.v1.FreeRequestH\x00R\x04free\x126\n" +
	"\x06commit\x18\x04 \x01(\v2\x1c.blockalloc.v1.CommitRequestH\x00R\x06commitB\x06\n" +
	"\x04call\"\x82\x02\n" +
	"\tCallReply\x12\x0e\n" +
	"\x02id\x18\x01 \x01(\x04R\x02id\x12=\n" +
	"\ballocate\x18\x02 \x01(\v2\x1f.blockalloc.v1.AllocateResponseH\x00R\ballocate\x121\n" +
	"\x04free\x18\x03 \x01(\v2\x1b.blockalloc.v1.FreeResponseH\x00R\x04free\x120\n" +
	"\x05error\x18\x04 \x01(\v2\x18.blockalloc.v1.CallErrorH\x00R\x05error\x127\n" +
	"\x06commit\x18\x05 \x01(\v2\x1d.blockalloc.v1.CommitResponseH\x00R\x06commitB\b\n" +
	"\x06result\"\xa6\x01\n" +
	"\tCallError\x12\x12\n" +
	"\x04code\x18\x01 \x01(\x05R\x04code\x12\x18\n" +
	"\amessage\x18\x02 \x01(\tR\amessage\x128\n" +
	"\bno_space\x18\x03 \x01(\v2\x1d.blockalloc.v1.NoSpaceDetailsR\anoSpace\x121\n" +
	"\x05quota\x18\x04 \x01(\v2\x1b.blockalloc.v1.QuotaDetailsR\x05quota\"\x88\x02\n" +
	"\x0eNoSpaceDetails\x12)\n" +
	"\x10requested_blocks\x18\x01 \x01(\x04R\x0frequestedBlocks\x12\x1f\n" +
	"\vfree_blocks\x18\x02 \x01(\x04R\n" +
	"freeBlocks\x12.\n" +
	"\x13largest_free_extent\x18\x03 \x01(\x04R\x11largestFreeExtent\x12\x1f\n" +
	"\vused_blocks\x18\x04 \x01(\x04R\n" +
	"usedBlocks\x120\n" +
	"\x14leased_unused_blocks\x18\x05 \x01(\x04R\x12leasedUnusedBlocks\x12'\n" +
	"\x0fcapacity_blocks\x18\x06 \x01(\x04R\x0ecapacityBlocks\"\x9f\x01\n" +
	"\fQuotaDetails\x12\x16\n" +
	"\x06tenant\x18\x01 \x01(\tR\x06tenant\x12\x16\n" +
	"\x06device\x18\x02 \x01(\tR\x06device\x12\x1f\n" +
	"\vquota_bytes\x18\x03 \x01(\x04R\n" +
	"quotaBytes\x12\x1d\n" +
	"\n" +
	"held_bytes\x18\x04 \x01(\x04R\theldBytes\x12\x1f\n" +
	"\vasked_bytes\x18\x05 \x01(\x04R\n" +
	"askedBytes\"\x16\n" +
	"\x14WatchTopologyRequest\"\xb0\x01\n" +
	"\bTopology\x12\x1a\n" +
	"\brevision\x18\x01 \x01(\x04R\brevision\x12\x18\n" +
	"\acluster\x18\x02 \x01(\tR\acluster\x126\n" +
	"\aservers\x18\x03 \x03(\v2\x1c.blockalloc.v1.ClusterServerR\aservers\x126\n" +
	"\adevices\x18\x04 \x03(\v2\x1c.blockalloc.v1.ClusterDeviceR\adevices\"\x89\x01\n" +
	"\rClusterServer\x12\x12\n" +
	"\x04name\x18\x01 \x01(\tR\x04name\x12\x18\n" +
	"\aaddress\x18\x02 \x01(\tR\aaddress\x12\x18\n" +
	"\adevices\x18\x03 \x03(\tR\adevices\x12\x16\n" +
	"\x06labels\x18\x04 \x03(\tR\x06labels\x12\x18\n" +
	"\aversion\x18\x05 \x01(\tR\aversion\"\xb2\x02\n" +
	"\rClusterDevice\x12\x12\n" +
	"\x04name\x18\x01 \x01(\tR\x04name\x12\x16\n" +
	"\x06server\x18\x02 \x01(\tR\x06server\x12\x18\n" +
	"\aaddress\x18\x03 \x01(\tR\aaddress\x12\x14\n" +
	"\x05epoch\x18\x04 \x01(\x04R\x05epoch\x12\x1f\n" +
	"\vspace_known\x18\x05 \x01(\bR\n" +
	"spaceKnown\x12\x1d\n" +
	"\n" +
	"block_size\x18\x06 \x01(\x04R\tblockSize\x12'\n" +
	"\x0fcapacity_blocks\x18\a \x01(\x04R\x0ecapacityBlocks\x12\x1f\n" +
	"\vfree_blocks\x18\b \x01(\x04R\n" +
	"freeBlocks\x12#\n" +
	"\rleased_blocks\x18\t \x01(\x04R\fleasedBlocks\x12\x16\n" +
	"\x06labels\x18\n" +
	" \x03(\tR\x06labels2\xdf\x05\n" +
	"\tAllocator\x12K\n" +
	"\bAllocate\x12\x1e.blockalloc.v1.AllocateRequest\x1a\x1f.blockalloc.v1.AllocateResponse\x12?\n" +
	"\x04Free\x12\x1a.blockalloc.v1.FreeRequest\x1a\x1b.blockalloc.v1.FreeResponse\x12E\n" +
	"\x06Status\x12\x1c.blockalloc.v1.StatusRequest\x1a\x1d.blockalloc.v1.StatusResponse\x12B\n" +
	"\x05Lease\x12\x1b.blockalloc.v1.LeaseRequest\x1a\x1c.blockalloc.v1.LeaseResponse\x12E\n" +
	"\x06Commit\x12\x1c.blockalloc.v1.CommitRequest\x1a\x1d.blockalloc.v1.CommitResponse\x12B\n" +
	"\x05Renew\x12\x1b.blockalloc.v1.RenewRequest\x1a\x1c.blockalloc.v1.RenewResponse\x12H\n" +
	"\aRelease\x12\x1d.blockalloc.v1.ReleaseRequest\x1a\x1e.blockalloc.v1.ReleaseResponse\x12P\n" +
	"\fWatchRecalls\x12\".blockalloc.v1.WatchRecallsRequest\x1a\x1a.blockalloc.v1.RecallEvent0\x01\x12A\n" +
	"\x05Calls\x12\x1a.blockalloc.v1.CallRequest\x1a\x18.blockalloc.v1.CallReply(\x010\x01\x12O\n" +
	"\rWatchTopology\x12#.blockalloc.v1.WatchTopologyRequest\x1a\x17.blockalloc.v1.Topology0\x01b\x06proto3"

var (
	file_blockalloc_v1_allocator_proto_rawDescOnce sync.Once
	file_blockalloc_v1_allocator_proto_rawDescData []byte
)

func file_blockalloc_v1_allocator_proto_rawDescGZIP() []byte {
	file_blockalloc_v1_allocator_proto_rawDescOnce.Do(func() {
		file_blockalloc_v1_allocator_proto_rawDescData = protoimpl.X.CompressGZIP(unsafe.Slice(unsafe.StringData(file_blockalloc_v1_allocator_proto_rawDesc), len(file_blockalloc_v1_allocator_proto_rawDesc)))
	})
	return file_blockalloc_v1_allocator_proto_rawDescData
}

var file_blockalloc_v1_allocator_proto_msgTypes = make([]protoimpl.MessageInfo, 31)
var file_blockalloc_v1_allocator_proto_goTypes = []any{
	(*DeviceRef)(nil),            // 0: blockalloc.v1.DeviceRef
	(*Extent)(nil),               // 1: blockalloc.v1.Extent
	(*AllocateRequest)(nil),      // 2: blockalloc.v1.AllocateRequest
	(*Object)(nil),               // 3: blockalloc.v1.Object
	(*AllocateResponse)(nil),     // 4: blockalloc.v1.AllocateResponse
	(*FreeRequest)(nil),          // 5: blockalloc.v1.FreeRequest
	(*FreeResponse)(nil),         // 6: blockalloc.v1.FreeResponse
	(*StatusRequest)(nil),        // 7: blockalloc.v1.StatusRequest
	(*DeviceStatus)(nil),         // 8: blockalloc.v1.DeviceStatus
	(*TenantStatus)(nil),         // 9: blockalloc.v1.TenantStatus
	(*StatusResponse)(nil),       // 10: blockalloc.v1.StatusResponse
	(*LeaseStatus)(nil),          // 11: blockalloc.v1.LeaseStatus
	(*LeaseRequest)(nil),         // 12: blockalloc.v1.LeaseRequest
	(*LeaseResponse)(nil),        // 13: blockalloc.v1.LeaseResponse
	(*CommitRequest)(nil),        // 14: blockalloc.v1.CommitRequest
	(*CommitResponse)(nil),       // 15: blockalloc.v1.CommitResponse
	(*RenewRequest)(nil),         // 16: blockalloc.v1.RenewRequest
	(*RenewResponse)(nil),        // 17: blockalloc.v1.RenewResponse
	(*ReleaseRequest)(nil),       // 18: blockalloc.v1.ReleaseRequest
	(*ReleaseResponse)(nil),      // 19: blockalloc.v1.ReleaseResponse
	(*WatchRecallsRequest)(nil),  // 20: blockalloc.v1.WatchRecallsRequest
	(*RecallEvent)(nil),          // 21: blockalloc.v1.RecallEvent
	(*CallRequest)(nil),          // 22: blockalloc.v1.CallRequest
	(*CallReply)(nil),            // 23: blockalloc.v1.CallReply
	(*CallError)(nil),            // 24: blockalloc.v1.CallError
	(*NoSpaceDetails)(nil),       // 25: blockalloc.v1.NoSpaceDetails
	(*QuotaDetails)(nil),         // 26: blockalloc.v1.QuotaDetails
	(*WatchTopologyRequest)(nil), // 27: blockalloc.v1.WatchTopologyRequest
	(*Topology)(nil),             // 28: blockalloc.v1.Topology
	(*ClusterServer)(nil),        // 29: blockalloc.v1.ClusterServer
	(*ClusterDevice)(nil),        // 30: blockalloc.v1.ClusterDevice
}
var file_blockalloc_v1_allocator_proto_depIdxs = []int32{
	0,  // 0: blockalloc.v1.AllocateRequest.device:type_name -> blockalloc.v1.DeviceRef
	1,  // 1: blockalloc.v1.Object.extents:type_name -> blockalloc.v1.Extent
	3,  // 2: blockalloc.v1.AllocateResponse.objects:type_name -> blockalloc.v1.Object
	0,  // 3: blockalloc.v1.FreeRequest.device:type_name -> blockalloc.v1.DeviceRef
	1,  // 4: blockalloc.v1.FreeRequest.extents:type_name -> blockalloc.v1.Extent
	0,  // 5: blockalloc.v1.StatusRequest.device:type_name -> blockalloc.v1.DeviceRef
	9,  // 6: blockalloc.v1.DeviceStatus.tenants:type_name -> blockalloc.v1.TenantStatus
	8,  // 7: blockalloc.v1.StatusResponse.devices:type_name -> blockalloc.v1.DeviceStatus
	11, // 8: blockalloc.v1.StatusResponse.leases:type_name -> blockalloc.v1.LeaseStatus
	0,  // 9: blockalloc.v1.LeaseRequest.device:type_name -> blockalloc.v1.DeviceRef
	1,  // 10: blockalloc.v1.LeaseResponse.extents:type_name -> blockalloc.v1.Extent
	1,  // 11: blockalloc.v1.CommitRequest.allocations:type_name -> blockalloc.v1.Extent
	1,  // 12: blockalloc.v1.CommitRequest.frees:type_name -> blockalloc.v1.Extent
	1,  // 13: blockalloc.v1.CommitResponse.recycled:type_name -> blockalloc.v1.Extent
	0,  // 14: blockalloc.v1.WatchRecallsRequest.device:type_name -> blockalloc.v1.DeviceRef
	2,  // 15: blockalloc.v1.CallRequest.allocate:type_name -> blockalloc.v1.AllocateRequest
	5,  // 16: blockalloc.v1.CallRequest.free:type_name -> blockalloc.v1.FreeRequest
	14, // 17: blockalloc.v1.CallRequest.commit:type_name -> blockalloc.v1.CommitRequest
	4,  // 18: blockalloc.v1.CallReply.allocate:type_name -> blockalloc.v1.AllocateResponse
	6,  // 19: blockalloc.v1.CallReply.free:type_name -> blockalloc.v1.FreeResponse
	24, // 20: blockalloc.v1.CallReply.error:type_name -> blockalloc.v1.CallError
	15, // 21: blockalloc.v1.CallReply.commit:type_name -> blockalloc.v1.CommitResponse
	25, // 22: blockalloc.v1.CallError.no_space:type_name -> blockalloc.v1.NoSpaceDetails
	26, // 23: blockalloc.v1.CallError.quota:type_name -> blockalloc.v1.QuotaDetails
	29, // 24: blockalloc.v1.Topology.servers:type_name -> blockalloc.v1.ClusterServer
	30, // 25: blockalloc.v1.Topology.devices:type_name -> blockalloc.v1.ClusterDevice
	2,  // 26: blockalloc.v1.Allocator.Allocate:input_type -> blockalloc.v1.AllocateRequest
	5,  // 27: blockalloc.v1.Allocator.Free:input_type -> blockalloc.v1.FreeRequest
	7,  // 28: blockalloc.v1.Allocator.Status:input_type -> blockalloc.v1.StatusRequest
	12, // 29: blockalloc.v1.Allocator.Lease:input_type -> blockalloc.v1.LeaseRequest
	14, // 30: blockalloc.v1.Allocator.Commit:input_type -> blockalloc.v1.CommitRequest
	16, // 31: blockalloc.v1.Allocator.Renew:input_type -> blockalloc.v1.RenewRequest
	18, // 32: blockalloc.v1.Allocator.Release:input_type -> blockalloc.v1.ReleaseRequest
	20, // 33: blockalloc.v1.Allocator.WatchRecalls:input_type -> blockalloc.v1.WatchRecallsRequest
	22, // 34: blockalloc.v1.Allocator.Calls:input_type -> blockalloc.v1.CallRequest
	27, // 35: blockalloc.v1.Allocator.WatchTopology:input_type -> blockalloc.v1.WatchTopologyRequest
	4,  // 36: blockalloc.v1.Allocator.Allocate:output_type -> blockalloc.v1.AllocateResponse
	6,  // 37: blockalloc.v1.Allocator.Free:output_type -> blockalloc.v1.FreeResponse
	10, // 38: blockalloc.v1.Allocator.Status:output_type -> blockalloc.v1.StatusResponse
	13, // 39: blockalloc.v1.Allocator.Lease:output_type -> blockalloc.v1.LeaseResponse
	15, // 40: blockalloc.v1.Allocator.Commit:output_type -> blockalloc.v1.CommitResponse
	17, // 41: blockalloc.v1.Allocator.Renew:output_type -> blockalloc.v1.RenewResponse
	19, // 42: blockalloc.v1.Allocator.Release:output_type -> blockalloc.v1.ReleaseResponse
	21, // 43: blockalloc.v1.Allocator.WatchRecalls:output_type -> blockalloc.v1.RecallEvent
	23, // 44: blockalloc.v1.Allocator.Calls:output_type -> blockalloc.v1.CallReply
	28, // 45: blockalloc.v1.Allocator.WatchTopology:output_type -> blockalloc.v1.Topology
	36, // [36:46] is the sub-list for method output_type
	26, // [26:36] is the sub-list for method input_type
	26, // [26:26] is the sub-list for extension type_name
	26, // [26:26] is the sub-list for extension extendee
	0,  // [0:26] is the sub-list for field type_name
}

func init() { file_blockalloc_v1_allocator_proto_init() }
func file_blockalloc_v1_allocator_proto_init() {
	if File_blockalloc_v1_allocator_proto != nil {
		return
	}
	file_blockalloc_v1_allocator_proto_msgTypes[0].OneofWrappers = []any{
		(*DeviceRef_Name)(nil),
		(*DeviceRef_Index)(nil),
	}
	file_blockalloc_v1_allocator_proto_msgTypes[2].OneofWrappers = []any{
		(*AllocateRequest_Blocks)(nil),
		(*AllocateRequest_Bytes)(nil),
	}
	file_blockalloc_v1_allocator_proto_msgTypes[12].OneofWrappers = []any{}
	file_blockalloc_v1_allocator_proto_msgTypes[22].OneofWrappers = []any{
		(*CallRequest_Allocate)(nil),
		(*CallRequest_Free)(nil),
		(*CallRequest_Commit)(nil),
	}
	file_blockalloc_v1_allocator_proto_msgTypes[23].OneofWrappers = []any{
		(*CallReply_Allocate)(nil),
		(*CallReply_Free)(nil),
		(*CallReply_Error)(nil),
		(*CallReply_Commit)(nil),
	}
	type x struct{}
	out := protoimpl.TypeBuilder{
		File: protoimpl.DescBuilder{
			GoPackagePath: reflect.TypeOf(x{}).PkgPath(),
			RawDescriptor: unsafe.Slice(unsafe.StringData(file_blockalloc_v1_allocator_proto_rawDesc), len(file_blockalloc_v1_allocator_proto_rawDesc)),
			NumEnums:      0,
			NumMessages:   31,
			NumExtensions: 0,
			NumServices:   1,
		},
		GoTypes:           file_blockalloc_v1_allocator_proto_goTypes,
		DependencyIndexes: file_blockalloc_v1_allocator_proto_depIdxs,
		MessageInfos:      file_blockalloc_v1_allocator_proto_msgTypes,
	}.Build()
	File_blockalloc_v1_allocator_proto = out.File
	file_blockalloc_v1_allocator_proto_goTypes = nil
	file_blockalloc_v1_allocator_proto_depIdxs = nil
}
