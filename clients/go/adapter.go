package blockalloc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/blockalloc/blockalloc/clients/go/disk"
)

// BlockAllocator is the interface of the original design; every allocator
// of it, and its client/server experiment, implement it. Ranges are
// [start, end): end is the block just past the range.
type BlockAllocator interface {
	GetDisk() disk.Disk
	AllocateContinuousBlocks(n uint64) (uint64, uint64, error) // start, end
	TryAllocateBlocks(n uint64) (uint64, uint64, error)
	FreeBlocks(start, end uint64) error
	GetStatus() (uint64, uint64) // used, total
	Shutdown() error
}

// Adapter implements BlockAllocator over a Client, per call or (with
// AdapterOptions.Lease) through a Leasing allocator.
//
// The interface has no context: each call gets one with
// AdapterOptions.Timeout.
//
// TryAllocateBlocks returns one range, while the service's scattered
// allocation returns several extents. So it returns a contiguous range of
// n blocks when there is one, and otherwise the longest free run the
// server reports (at most n blocks): a prefix of the request. The caller
// asks again for the remaining n - (end - start) blocks, as with a short
// write. It fails with ErrNoSpace only when the device has no free block.
//
// A refusal for want of space is the server's *NoSpaceError (ErrNoSpace),
// with the device's state at the refusal in its Details.
type Adapter struct {
	c       *Client
	l       *Leasing
	timeout time.Duration
	disk    disk.Remote

	mu         sync.Mutex
	used, tot  uint64
	shutdownMu sync.Once
	shutErr    error
}

// AdapterOptions configure NewAdapter.
type AdapterOptions struct {
	// Lease makes allocations local, inside leased regions; a range is
	// durable after the next commit (Shutdown commits).
	Lease bool
	// LeaseOptions when Lease is set.
	LeaseOptions LeaseOptions
	// Timeout of each call; 0 means 30 s.
	Timeout time.Duration
}

var _ BlockAllocator = (*Adapter)(nil)

// NewAdapter asks the server for the device's geometry and returns the
// adapter. Shutdown closes c too.
func NewAdapter(c *Client, opts AdapterOptions) (*Adapter, error) {
	a := &Adapter{c: c, timeout: opts.Timeout}
	if a.timeout <= 0 {
		a.timeout = 30 * time.Second
	}
	ctx, cancel := a.ctx()
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		return nil, err
	}
	a.disk = disk.Remote{
		Addr: c.addr, DeviceName: st.Name, Index: st.Index,
		BlockBytes: st.BlockSize, BlockCount: st.CapacityBlocks,
	}
	a.used, a.tot = st.UsedBlocks, st.CapacityBlocks
	if opts.Lease {
		a.l = c.NewLeasing(opts.LeaseOptions)
	}
	return a, nil
}

func (a *Adapter) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), a.timeout)
}

// Leasing is the leasing allocator under the adapter, or nil per call.
func (a *Adapter) Leasing() *Leasing { return a.l }

// GetDisk is the served device.
func (a *Adapter) GetDisk() disk.Disk { return a.disk }

// AllocateContinuousBlocks allocates n contiguous blocks, [start, end).
func (a *Adapter) AllocateContinuousBlocks(n uint64) (uint64, uint64, error) {
	ctx, cancel := a.ctx()
	defer cancel()
	var e Extent
	var err error
	if a.l != nil {
		e, err = a.l.Allocate(ctx, n)
	} else {
		e, err = a.c.Allocate(ctx, n)
	}
	if err != nil {
		return 0, 0, err
	}
	return e.Start, e.End(), nil
}

// TryAllocateBlocks allocates up to n contiguous blocks, [start, end): all
// n when a run that long is free, else a prefix of the request as long as
// the longest free run (see Adapter).
func (a *Adapter) TryAllocateBlocks(n uint64) (uint64, uint64, error) {
	start, end, err := a.AllocateContinuousBlocks(n)
	if !errors.Is(err, ErrNoSpace) {
		return start, end, err
	}
	// Free runs change under other clients, so retry a few times with the
	// longest run the server reports now.
	for range 8 {
		ctx, cancel := a.ctx()
		st, serr := a.c.Status(ctx)
		cancel()
		if serr != nil {
			return 0, 0, serr
		}
		m := min(n, st.LargestFreeExtent)
		if m == 0 {
			return 0, 0, err
		}
		ctx, cancel = a.ctx()
		e, aerr := a.c.Allocate(ctx, m)
		cancel()
		if aerr == nil {
			return e.Start, e.End(), nil
		}
		if !errors.Is(aerr, ErrNoSpace) {
			return 0, 0, aerr
		}
		err = aerr
	}
	return 0, 0, err
}

// FreeBlocks frees [start, end). Per call it is durable on return; leased,
// after the next commit.
func (a *Adapter) FreeBlocks(start, end uint64) error {
	if end <= start {
		return invalid("cannot free [%d, %d): end must be past start", start, end)
	}
	e := Extent{Start: start, Len: end - start}
	if a.l != nil {
		return a.l.Free(e)
	}
	ctx, cancel := a.ctx()
	defer cancel()
	_, err := a.c.Free(ctx, e)
	return err
}

// GetStatus is (used, total) in blocks: the server's used blocks
// (committed allocations and metadata; uncommitted leased allocations are
// not counted) and the device's block count. The interface has no error:
// when the server cannot be reached it returns the last values it had.
func (a *Adapter) GetStatus() (uint64, uint64) {
	ctx, cancel := a.ctx()
	defer cancel()
	st, err := a.c.Status(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil {
		a.used, a.tot = st.UsedBlocks, st.CapacityBlocks
	}
	return a.used, a.tot
}

// Shutdown commits what the leasing allocator holds, releases its leases,
// and closes the client. Calls after the first return its result.
func (a *Adapter) Shutdown() error {
	a.shutdownMu.Do(func() {
		var lerr error
		if a.l != nil {
			ctx, cancel := a.ctx()
			lerr = a.l.Close(ctx)
			cancel()
		}
		cerr := a.c.Close()
		if cerr != nil {
			cerr = fmt.Errorf("closing the connection: %w", cerr)
		}
		a.shutErr = errors.Join(lerr, cerr)
	})
	return a.shutErr
}
