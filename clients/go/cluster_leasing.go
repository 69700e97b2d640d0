package blockalloc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// deviceClients numbers the device clients of this process: each one's
// resolver has a scheme of its own.
var deviceClients atomic.Uint64

// DeviceClient is a *Client of device (its Options.Device is device; the
// rest are the Cluster's options) whose connection follows the device's
// owner: each time the Cluster's topology names a new owner, the
// connection moves to it; while the device has no owner it keeps the last
// one (calls fail as unavailable, and are sent again as Client says, until
// an owner serves). Before the topology has named any owner, calls wait
// for one (bound them with their context). The client starts from the
// newest epoch the Cluster knows for the device, so a stale owner's reply
// is refused from the first call on. Its Addr is the owner's address when
// it was made.
//
// A goroutine follows the topology until the client's Close or the
// Cluster's Close; after the Cluster's Close the connection stays where
// it was. Close the client when done with it.
//
// A device that no server of the cluster lists fails it at once: a
// *RefusedError with NOT_FOUND, as the Cluster's calls on it.
func (c *Cluster) DeviceClient(device string) (*Client, error) {
	return c.deviceClient(device, false)
}

// deviceClient is DeviceClient; with closeWithCluster, the Cluster's
// Close closes the client too.
func (c *Cluster) deviceClient(device string, closeWithCluster bool) (*Client, error) {
	if c.ctx.Err() != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, ErrClosed)
	}
	d, epoch, _, _, err := c.owner(device)
	if err != nil {
		return nil, err
	}
	addr := d.GetAddress()
	scheme := fmt.Sprintf("blockalloc-device-%d", deviceClients.Add(1))
	r := manual.NewBuilderWithScheme(scheme)
	if addr != "" {
		r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: addr}}})
	}
	opts := c.opts
	opts.Device, opts.DeviceIndex = device, 0
	cl, err := dial(scheme+":///"+device, addr, opts, grpc.WithResolvers(r))
	if err != nil {
		return nil, err
	}
	cl.epoch.Store(epoch)
	ctx, cancel := context.WithCancel(c.ctx)
	done := make(chan struct{})
	cl.stop = func() {
		cancel()
		<-done
	}
	go func() {
		last := addr
		for {
			c.mu.Lock()
			now, changed := c.owners[device].GetAddress(), c.changed
			c.mu.Unlock()
			if now != "" && now != last {
				r.UpdateState(resolver.State{Addresses: []resolver.Address{{Addr: now}}})
				last = now
			}
			select {
			case <-changed:
			case <-ctx.Done():
				close(done)
				if closeWithCluster && c.ctx.Err() != nil {
					_ = cl.Close()
				}
				return
			}
		}
	}()
	return cl, nil
}

// Leasing is a Leasing (see (*Client).NewLeasing) on device whose
// connection follows the device's owner (see DeviceClient): after a
// failover its commits and renewals, sent again until the lease's
// deadline as a Leasing does, reach the new owner, which restored the
// lease from the device's journal. Allocations that no commit got through
// for by then are reported lost, as always.
//
// Close the Leasing before the Cluster: the Leasing's connection is closed
// with the Leasing (its Close does not close it) only when the Cluster is
// closed. Errors as DeviceClient's.
func (c *Cluster) Leasing(device string, opts LeaseOptions) (*Leasing, error) {
	cl, err := c.deviceClient(device, true)
	if err != nil {
		return nil, err
	}
	return cl.NewLeasing(opts), nil
}

// ClusterLeasing allocates at local speed across a cluster: a Leasing per
// device it uses, each following its device's owner (Cluster.Leasing), so
// that its leases survive a failover.
//
// Allocations go to one device at a time, the current device, chosen as
// Cluster.Allocate chooses (two random choices over the devices' free
// space, within the Placement). When the current device has no room (its
// Leasing answers ErrNoSpace: no lease, and a per-call allocation refused
// too), the Cluster reckons it full and the ClusterLeasing moves to the
// next device the placement chooses, keeping the old device's Leasing for
// its frees and commits. Every allocation names its device: free it there.
// The writer's rule (see the package docs) holds for each allocation as
// for a Leasing's.
//
// A ClusterLeasing is safe for many goroutines. Close it before the
// Cluster.
//
//	cl := blockalloc.NewClusterLeasing(c, blockalloc.Placement{}, blockalloc.LeaseOptions{})
//	device, e, err := cl.Allocate(ctx, 256) // local, after the first lease
//	if err != nil { ... }
//	err = cl.Commit(ctx) // durable now
//	err = cl.Free(device, e)
//	err = cl.Close(ctx)
type ClusterLeasing struct {
	c     *Cluster
	place Placement
	opts  LeaseOptions

	mu sync.Mutex
	// current is the device allocations go to now; "" until one is chosen,
	// and after it filled.
	current string
	// leases holds a Leasing per device used, by device name.
	leases map[string]*Leasing
	closed bool
}

// NewClusterLeasing makes a ClusterLeasing on c's devices that place
// admits, each device's Leasing with opts. It takes no lease until the
// first Allocate.
func NewClusterLeasing(c *Cluster, place Placement, opts LeaseOptions) *ClusterLeasing {
	return &ClusterLeasing{c: c, place: place, opts: opts, leases: make(map[string]*Leasing)}
}

// lease is device's Leasing, made on first use.
func (cl *ClusterLeasing) lease(device string) (*Leasing, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		return nil, ErrClosed
	}
	if l := cl.leases[device]; l != nil {
		return l, nil
	}
	l, err := cl.c.Leasing(device, cl.opts)
	if err != nil {
		return nil, err
	}
	cl.leases[device] = l
	return l, nil
}

// Allocate allocates n contiguous blocks on the current device, or, when
// it has no room, on the next device the placement chooses (as
// Cluster.Allocate does, with need = n), each device tried at most once
// per call. It returns the device and the extent, pending until a Commit
// made it durable (see Leasing.Allocate).
//
// Errors: a *NoSpaceError (ErrNoSpace) when no device that the placement
// admits has room; otherwise as Leasing.Allocate's of the device tried
// (ErrQuota...), ErrClosed after Close. While the device is between
// owners (ErrUnavailable, ErrOutcomeUnknown) the call waits for the next
// one, as Cluster's calls do, for Options.RetryFor.
func (cl *ClusterLeasing) Allocate(ctx context.Context, n uint64) (device string, e Extent, err error) {
	if n == 0 {
		return "", Extent{}, invalid("cannot allocate zero blocks")
	}
	maxUsed := cl.place.MaxUsed
	if maxUsed == 0 {
		maxUsed = DefaultMaxUsed
	}
	tried := make(map[string]bool)
	var refusals []string
	for {
		cl.mu.Lock()
		device, closed := cl.current, cl.closed
		cl.mu.Unlock()
		if closed {
			return "", Extent{}, ErrClosed
		}
		if device == "" || tried[device] {
			var cluster string
			device, cluster = cl.c.place(cl.place.Labels, maxUsed, n, tried)
			if device == "" {
				return "", Extent{}, cl.c.noDevice(cluster, cl.place, n, refusals)
			}
			cl.mu.Lock()
			cl.current = device
			cl.mu.Unlock()
		}
		tried[device] = true
		l, err := cl.lease(device)
		if err != nil {
			return "", Extent{}, err
		}
		var e Extent
		err = cl.c.untilOwned(ctx, func() (err error) {
			e, err = l.Allocate(ctx, n)
			return err
		})
		if err == nil {
			return device, e, nil
		}
		var ns *NoSpaceError
		if !errors.As(err, &ns) || errors.Is(err, ErrQuota) {
			return "", Extent{}, err
		}
		cl.c.mu.Lock()
		cl.c.deviceLocked(device).estimate = 0
		cl.c.mu.Unlock()
		cl.mu.Lock()
		if cl.current == device {
			cl.current = ""
		}
		cl.mu.Unlock()
		refusals = append(refusals, fmt.Sprintf("%s: %s", device, ns.Reason))
	}
}

// Free frees e, allocated on device by this ClusterLeasing, through that
// device's Leasing (see Leasing.Free): an uncommitted allocation goes back
// to its lease, a committed one is freed with the next commit.
//
// Errors: a *RefusedError with INVALID_ARGUMENT for a device this
// ClusterLeasing never allocated on; as Leasing.Free's.
func (cl *ClusterLeasing) Free(device string, e Extent) error {
	cl.mu.Lock()
	l, closed := cl.leases[device], cl.closed
	cl.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case l == nil:
		return &RefusedError{Code: codes.InvalidArgument,
			Reason: fmt.Sprintf("device %q: this ClusterLeasing allocated nothing there", device)}
	}
	return l.Free(e)
}

// Commit waits until every allocation and free made before the call, on
// every device, is durable (see Leasing.Commit). It commits every
// device's Leasing, whatever the others answer, and returns the first
// error: a *LostError (ErrLost) with lost allocations of that device...
// While a device is between owners it waits for the next one, as
// Allocate does.
func (cl *ClusterLeasing) Commit(ctx context.Context) error {
	var first error
	for _, l := range cl.all() {
		err := cl.c.untilOwned(ctx, func() error { return l.Commit(ctx) })
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// untilOwned runs call again while it fails in a way a new owner of the
// device may cure (ErrUnavailable, ErrOutcomeUnknown: the device is
// between owners), once the topology changed or a pause passed (10 ms
// doubling to 1 s), for at most c.retryFor: a failover is a wait, not an
// error.
func (c *Cluster) untilOwned(ctx context.Context, call func() error) error {
	start := time.Now()
	wait := retryFirstWait
	for {
		err := call()
		if err == nil || !c.retryable(ctx, err) || time.Since(start)+wait > c.retryFor {
			return err
		}
		_, changed := c.Watch()
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		wait = min(2*wait, retryMaxWait)
	}
}

// all are the devices' Leasings, by device name.
func (cl *ClusterLeasing) all() []*Leasing {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	names := make([]string, 0, len(cl.leases))
	for name := range cl.leases {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]*Leasing, len(names))
	for i, name := range names {
		out[i] = cl.leases[name]
	}
	return out
}

// Close commits everything pending, closes every device's Leasing (their
// leases are released) and their connections; later calls fail with
// ErrClosed. It returns the first error of a Leasing's Close (see
// Leasing.Close); every one is closed regardless.
func (cl *ClusterLeasing) Close(ctx context.Context) error {
	all := cl.all()
	cl.mu.Lock()
	already := cl.closed
	cl.closed = true
	cl.mu.Unlock()
	if already {
		return ErrClosed
	}
	var first error
	for _, l := range all {
		if err := l.Close(ctx); err != nil && first == nil {
			first = err
		}
		_ = l.c.Close()
	}
	return first
}
