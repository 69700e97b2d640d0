// Package disk describes a device as the original BlockAllocator interface
// sees it: its name, where it lives, its size and block size.
package disk

import "fmt"

// Disk is a device whose space an allocator hands out.
type Disk interface {
	// Name is the device's name (the file name of its path on the server).
	Name() string
	// Path says where the device is: for a device of an allocation server,
	// "blockalloc://ADDR/NAME".
	Path() string
	// Size is the device's size in bytes (Blocks() * BlockSize()).
	Size() uint64
	// BlockSize is the allocation unit in bytes.
	BlockSize() uint64
	// Blocks is the number of blocks, metadata included.
	Blocks() uint64
}

// Remote is a device served by an allocation server.
type Remote struct {
	// Addr is the server's address.
	Addr string
	// DeviceName is the device's name on the server.
	DeviceName string
	// Index is the device's position in the server's list.
	Index uint32
	// BlockBytes is the block size in bytes.
	BlockBytes uint64
	// BlockCount is the number of blocks.
	BlockCount uint64
}

// Name is the device's name on the server.
func (r Remote) Name() string { return r.DeviceName }

// Path is "blockalloc://ADDR/NAME".
func (r Remote) Path() string { return fmt.Sprintf("blockalloc://%s/%s", r.Addr, r.DeviceName) }

// Size is the device's size in bytes.
func (r Remote) Size() uint64 { return r.BlockBytes * r.BlockCount }

// BlockSize is the block size in bytes.
func (r Remote) BlockSize() uint64 { return r.BlockBytes }

// Blocks is the number of blocks.
func (r Remote) Blocks() uint64 { return r.BlockCount }

var _ Disk = Remote{}
