package blockalloc_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	blockalloc "github.com/blockalloc/blockalloc/clients/go"
)

// Per-call and leased allocation against a server started with
// `blockalloc serve --device dev0 --format 64GiB --listen 127.0.0.1:7878`.
func Example() {
	ctx := context.Background()
	c, err := blockalloc.Dial("127.0.0.1:7878", blockalloc.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	e, err := c.Allocate(ctx, 256) // 1 MiB of 4 KiB blocks, durable now
	if errors.Is(err, blockalloc.ErrNoSpace) {
		log.Fatal("device full")
	} else if err != nil {
		log.Fatal(err)
	}

	l := c.NewLeasing(blockalloc.LeaseOptions{})
	x, _ := l.Allocate(ctx, 16) // local, inside a lease
	_ = l.Free(e)
	if err := l.Commit(ctx); err != nil { // x allocated and e freed, durably
		log.Fatal(err)
	}
	fmt.Println(x)
	_ = l.Close(ctx) // the lease's unused rest goes back to the server
}

// The original interface, per call.
func ExampleAdapter() {
	c, _ := blockalloc.Dial("127.0.0.1:7878", blockalloc.Options{})
	var a blockalloc.BlockAllocator
	a, err := blockalloc.NewAdapter(c, blockalloc.AdapterOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Shutdown()
	start, end, err := a.AllocateContinuousBlocks(8)
	if err != nil {
		log.Fatal(err)
	}
	used, total := a.GetStatus()
	fmt.Println(start, end, used, total, a.GetDisk().Path())
	_ = a.FreeBlocks(start, end)
}

// What the device looked like when it refused an allocation.
func ExampleNoSpaceError() {
	c, _ := blockalloc.Dial("127.0.0.1:7878", blockalloc.Options{})
	defer c.Close()
	_, err := c.Allocate(context.Background(), 1<<20)
	var ns *blockalloc.NoSpaceError
	if errors.As(err, &ns) && ns.Details != nil {
		d := ns.Details
		fmt.Printf("%d blocks asked, %d free, longest free run %d\n",
			d.RequestedBlocks, d.FreeBlocks, d.LargestFreeExtent)
	} else if errors.Is(err, blockalloc.ErrNoSpace) {
		fmt.Println("no space:", ns.Reason) // a limit: no details
	}
}

// Which quota a refused call would have gone past.
func ExampleQuotaError() {
	c, _ := blockalloc.Dial("127.0.0.1:7878", blockalloc.Options{Token: "bat_..."})
	defer c.Close()
	_, err := c.Allocate(context.Background(), 1<<20)
	var q *blockalloc.QuotaError
	if errors.As(err, &q) {
		d := q.Details
		fmt.Printf("tenant %s on %s: quota %d bytes, %d held, %d asked\n",
			d.Tenant, d.Device, d.QuotaBytes, d.HeldBytes, d.AskedBytes)
	}
}

// The writer's rule: data goes into a leased allocation that is not
// committed yet only before its deadline (a write that may not finish by
// then commits first); a Commit that returns nil makes it the caller's for
// good, one whose *LostError lists it means that its blocks are free again
// on the server and must not be written. (Losses are reported once, to
// the first Commit that finds them: with goroutines that commit at once,
// the one that gets the error tells the others.)
func ExampleLeasing_Deadline() {
	ctx := context.Background()
	c, _ := blockalloc.Dial("127.0.0.1:7878", blockalloc.Options{})
	defer c.Close()
	l := c.NewLeasing(blockalloc.LeaseOptions{})
	defer l.Close(ctx)

	x, err := l.Allocate(ctx, 16)
	if err != nil {
		log.Fatal(err)
	}
	write := func(blockalloc.Extent) { /* the object's data goes to the device */ }
	if deadline, uncommitted := l.Deadline(x); !uncommitted || time.Now().Before(deadline) {
		write(x) // committed already, or still within the lease's deadline
	} else if err := l.Commit(ctx); err == nil {
		write(x) // durable now: no deadline any more
	} else {
		// Not written: x may be lost (a *LostError lists it: allocate
		// again) or not durable yet (ErrUnavailable: Commit again).
		log.Print(err)
	}
}
