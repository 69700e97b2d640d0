package blockalloc

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

func TestPerCallAllocateFreeAndStatus(t *testing.T) {
	s := startServer(t, serverOpts{size: "256MiB"})
	c := s.dial(t)
	ctx := ctxT(t)
	before := devStatus(t, c)
	if before.BlockSize != 4096 || before.CapacityBlocks != 65536 {
		t.Fatalf("status of a 256 MiB device: %v", before)
	}
	var got []Extent
	for n := uint64(1); n <= 64; n *= 2 {
		e, err := c.Allocate(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if e.Len != n || e.End() > before.CapacityBlocks {
			t.Fatalf("Allocate(%d) = %s", n, e)
		}
		got = append(got, e)
	}
	many, err := c.AllocateMany(ctx, 10, 3, nil)
	if err != nil || len(many) != 10 {
		t.Fatalf("AllocateMany: %v %v", many, err)
	}
	got = append(got, many...)
	sc, err := c.AllocateScattered(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, sc...)
	disjoint(t, got)
	var sum uint64
	for _, e := range got {
		sum += e.Len
	}
	mid := devStatus(t, c)
	if mid.UsedBlocks != before.UsedBlocks+sum {
		t.Fatalf("used %d, want %d + %d", mid.UsedBlocks, before.UsedBlocks, sum)
	}
	freed, err := c.Free(ctx, got...)
	if err != nil || freed != sum {
		t.Fatalf("Free: %d blocks, %v; want %d", freed, err, sum)
	}
	if after := devStatus(t, c); after.UsedBlocks != before.UsedBlocks {
		t.Fatalf("used %d after freeing everything, want %d", after.UsedBlocks, before.UsedBlocks)
	}
}

// Allocate and Free go over the Calls stream, and their errors keep the
// types a unary call's had.
func TestErrorsAreTyped(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c, calls := dialCounted(t, s.addr, Options{})
	ctx := ctxT(t)

	if _, err := c.Allocate(ctx, 1<<20); !errors.Is(err, ErrNoSpace) {
		t.Errorf("allocating more than the device: %v, want ErrNoSpace", err)
	}
	e, err := c.Allocate(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Free(ctx, e); err != nil {
		t.Fatal(err)
	}
	var ref *RefusedError
	if _, err := c.Free(ctx, e); !errors.As(err, &ref) || ref.Code != codes.FailedPrecondition {
		t.Errorf("double free: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := c.Free(ctx, Extent{Start: 1 << 40, Len: 1}); !errors.As(err, &ref) || ref.Code != codes.InvalidArgument {
		t.Errorf("free past the device: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := c.Allocate(ctx, 0); !errors.As(err, &ref) || ref.Code != codes.InvalidArgument {
		t.Errorf("zero blocks: %v, want INVALID_ARGUMENT", err)
	}
	other, err := Dial(s.addr, Options{Device: "no-such-device"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Status(ctx); !errors.As(err, &ref) || ref.Code != codes.NotFound {
		t.Errorf("unknown device: %v, want NOT_FOUND", err)
	}
	if _, err := other.Allocate(ctx, 1); !errors.As(err, &ref) || ref.Code != codes.NotFound {
		t.Errorf("allocating on an unknown device: %v, want NOT_FOUND", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Allocate(cancelled, 1); !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v, want ErrUnavailable and context.Canceled", err)
	}
	if s := devStatus(t, c); s.UsedBlocks != s.MetaBlocks {
		t.Errorf("refused requests changed the device: used %d, meta %d", s.UsedBlocks, s.MetaBlocks)
	}
	onOneStream(t, calls)
}

func TestNoServerIsUnavailable(t *testing.T) {
	// A port that was just free: nothing listens there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, err := Dial(addr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Status(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("status without a server: %v, want ErrUnavailable", err)
	}
}

func TestAdapterImplementsTheOriginalInterface(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	for _, lease := range []bool{false, true} {
		c, err := Dial(s.addr, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var a BlockAllocator
		ad, err := NewAdapter(c, AdapterOptions{Lease: lease, LeaseOptions: LeaseOptions{MinBlocks: 64}})
		if err != nil {
			t.Fatal(err)
		}
		a = ad
		d := a.GetDisk()
		if d.Size() != 64<<20 || d.BlockSize() != 4096 || d.Blocks() != 16384 || d.Name() != "dev0" ||
			d.Path() != "blockalloc://"+s.addr+"/dev0" {
			t.Fatalf("GetDisk: %+v (%s)", d, d.Path())
		}
		used0, total := a.GetStatus()
		if total != 16384 {
			t.Fatalf("GetStatus total %d", total)
		}
		start, end, err := a.AllocateContinuousBlocks(10)
		if err != nil || end-start != 10 {
			t.Fatalf("AllocateContinuousBlocks(10) = [%d, %d) %v", start, end, err)
		}
		s2, e2, err := a.TryAllocateBlocks(20)
		if err != nil || e2-s2 != 20 {
			t.Fatalf("TryAllocateBlocks(20) = [%d, %d) %v", s2, e2, err)
		}
		if lease {
			if err := ad.Leasing().Commit(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		}
		if used, _ := a.GetStatus(); used != used0+30 {
			t.Fatalf("lease=%v: used %d after 30 blocks, want %d", lease, used, used0+30)
		}
		if err := a.FreeBlocks(start, end); err != nil {
			t.Fatal(err)
		}
		if err := a.FreeBlocks(s2, e2); err != nil {
			t.Fatal(err)
		}
		var ref *RefusedError
		if err := a.FreeBlocks(5, 5); !errors.As(err, &ref) {
			t.Fatalf("FreeBlocks of an empty range: %v", err)
		}
		if err := a.Shutdown(); err != nil {
			t.Fatal(err)
		}
		st := devStatus(t, s.dial(t))
		if st.UsedBlocks != used0 || st.Leases != 0 || st.LeasedUnusedBlocks != 0 {
			t.Fatalf("lease=%v after Shutdown: %v", lease, st)
		}
	}
}

// TryAllocateBlocks on a device with no run of n free blocks returns the
// longest run there is: a prefix of the request.
func TestTryAllocateBlocksReturnsAPrefixWhenNoRunIsLongEnough(t *testing.T) {
	s := startServer(t, serverOpts{size: "64MiB"})
	c := s.dial(t)
	fragment(t, c, 8)
	if st := devStatus(t, c); st.LargestFreeExtent != 8 {
		t.Fatalf("largest free run %d, want 8", st.LargestFreeExtent)
	}
	a, err := NewAdapter(c, AdapterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.AllocateContinuousBlocks(20); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("AllocateContinuousBlocks(20) with runs of 8: %v, want ErrNoSpace", err)
	}
	start, end, err := a.TryAllocateBlocks(20)
	if err != nil || end-start != 8 {
		t.Fatalf("TryAllocateBlocks(20) = [%d, %d) %v, want 8 blocks", start, end, err)
	}
}

// fragment fills the device with objects of n blocks, then frees every
// other one: free space is runs of n blocks.
func fragment(t testing.TB, c *Client, n uint64) {
	t.Helper()
	ctx := ctxT(t)
	var objs []Extent
	for batch := uint32(512); batch > 0; {
		es, err := c.AllocateMany(ctx, batch, n, nil)
		if errors.Is(err, ErrNoSpace) {
			batch /= 2
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, es...)
	}
	// Whatever is left is shorter than n blocks.
	for {
		e, err := c.AllocateScattered(ctx, 1)
		if errors.Is(err, ErrNoSpace) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, e...)
	}
	sortByStart(objs)
	var holes []Extent
	for i := 0; i < len(objs); i += 2 {
		if objs[i].Len == n {
			holes = append(holes, objs[i])
		}
	}
	for i := 0; i < len(holes); i += MaxBatch {
		if _, err := c.Free(ctx, holes[i:min(i+MaxBatch, len(holes))]...); err != nil {
			t.Fatal(err)
		}
	}
}
