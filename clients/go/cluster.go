package blockalloc

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// Cluster is a client of a blockalloc cluster: servers that share the
// cluster's devices, each device owned by one server at a time, a standby
// taking it over when its owner dies (with a higher epoch). It learns the
// cluster's topology from the WatchTopology stream of any member, routes
// each call on a device to the device's owner of the moment, and places
// allocations on the cluster's devices by their free space and labels.
//
// Routing. Every AllocateOn and Free gets one request id (a random 64-bit
// start per Cluster, then counting up) and carries the newest epoch known
// for the device: the highest of those its replies showed and the
// topology's. A call that ended unavailable, cut off after it was sent
// (DEADLINE_EXCEEDED, CANCELLED, a broken connection), or answered with
// an older epoch than one known (a stale owner's reply: its result is not
// used), is sent again, the same request with the same id, to the device's
// owner of the moment, once the topology changed or a pause (10 ms doubling
// to 1 s) passed, for Options.RetryFor; so is a call on a device that has
// no owner now (its owner died, no standby took it yet). It is never sent
// to another device: the first sending may have run, and the device's
// server, or its next owner, which replays the device's journal, answers
// the id with the first call's result. A call on a device that no server
// of the topology lists (neither owned nor among a ClusterServer's
// devices) fails at once: a *RefusedError with NOT_FOUND. With
// Options.RetryFor NoRetry each call is sent once; it still carries a
// request id, as Client's calls do.
//
// Placement. Allocate picks a device by its free space (see Allocate)
// and allocates there, and tries another when the device has no room.
//
// A Cluster is safe for many goroutines. Close ends it.
//
//	c, err := blockalloc.DialCluster(ctx, []string{"10.0.0.1:7878", "10.0.0.2:7878"}, blockalloc.Options{})
//	if err != nil { ... }
//	defer c.Close()
//	p, err := c.Allocate(ctx, blockalloc.Placement{Labels: []string{"zone=a"}}, 1, 256)
//	if err != nil { ... }
//	// p.Extents are on device p.Device; free them there:
//	_, err = c.Free(ctx, p.Device, p.Extents...)
type Cluster struct {
	seeds    []string
	opts     Options
	retryFor time.Duration
	// lastRequest is the last request id handed out.
	lastRequest atomic.Uint64

	// ctx is the Cluster's lifetime: Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	// watchDone is closed when the topology watcher has ended.
	watchDone chan struct{}

	mu sync.Mutex
	// topo is the newest topology; owners indexes its devices by name.
	topo   *pb.Topology
	owners map[string]*pb.ClusterDevice
	// changed is closed when topo is replaced.
	changed chan struct{}
	// conns are the connections, by server address.
	conns map[string]*Client
	// devs is what this Cluster knows of each device it saw.
	devs   map[string]*clusterDevice
	rng    *rand.Rand
	closed bool
}

// clusterDevice is what a Cluster knows of one device.
type clusterDevice struct {
	// epoch is the newest epoch known: the highest of the replies' and
	// the topologies'.
	epoch uint64
	// published: a topology showed the device; pubFree and pubEpoch are
	// the (free_blocks, epoch) it last showed.
	published         bool
	pubFree, pubEpoch uint64
	// estimate is the device's free blocks as this Cluster reckons them:
	// pubFree (set again whenever a topology shows a different
	// (free_blocks, epoch)), replaced by the FreeBlocks of each Allocate
	// or Free reply from the device since (replayed ones too), and 0 after
	// the device answered an Allocate that it has no room.
	estimate uint64
}

// DefaultMaxUsed is Placement.MaxUsed when it is 0.
const DefaultMaxUsed = 0.95

// ErrNotCluster: a server that DialCluster asked for the cluster's
// topology is not a member of a cluster (it answered WatchTopology with
// FAILED_PRECONDITION). The error is also a *RefusedError with the
// server's reason. Dial connects to a single server.
var ErrNotCluster = errors.New("not in a cluster")

// topologyFirstWait bounds the wait for a WatchTopology stream's first
// message: a server that sends none is passed over for the next one.
const topologyFirstWait = 5 * time.Second

// DialCluster connects to the cluster whose members include one of seeds
// ("host:port" each): it opens WatchTopology on the first seed that
// answers, in order, and returns once it has the cluster's topology. opts
// are as for Dial (TLS, Token, RetryFor...; Device and DeviceIndex are
// ignored: each call names its device) and serve every server of the
// cluster. When no seed answers, it tries them all again, with backoff,
// for opts.RetryFor (NoRetry: once) or until ctx ends, then fails with
// ErrUnavailable. A seed that refuses (a server that is not in a
// cluster: ErrNotCluster; a bad token...) fails it at once, unless another
// seed answers.
//
// A goroutine keeps the stream: when it ends (its server stopped) it is
// opened again on the seeds or any server of the last topology, with
// backoff (10 ms doubling to 1 s), until Close.
func DialCluster(ctx context.Context, seeds []string, opts Options) (*Cluster, error) {
	if len(seeds) == 0 {
		return nil, invalid("no seed address: DialCluster needs the address of at least one member of the cluster")
	}
	opts.Device, opts.DeviceIndex = "", 0
	var seed [24]byte
	_, _ = crand.Read(seed[:]) // never fails (crypto/rand panics instead)
	cctx, cancel := context.WithCancel(context.Background())
	c := &Cluster{
		seeds:     slices.Clone(seeds),
		opts:      opts,
		ctx:       cctx,
		cancel:    cancel,
		watchDone: make(chan struct{}),
		owners:    make(map[string]*pb.ClusterDevice),
		changed:   make(chan struct{}),
		conns:     make(map[string]*Client),
		devs:      make(map[string]*clusterDevice),
		rng:       rand.New(rand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:]))),
	}
	switch {
	case opts.RetryFor == 0:
		c.retryFor = DefaultRetryFor
	case opts.RetryFor > 0:
		c.retryFor = opts.RetryFor
	}
	// Ids of two clients must not meet in a server's window of recent ids.
	c.lastRequest.Store(binary.LittleEndian.Uint64(seed[16:]))

	start := time.Now()
	wait := retryFirstWait
	for {
		w, err := c.openFirst(ctx, c.seeds)
		if err == nil {
			go c.watch(w)
			return c, nil
		}
		var refused *RefusedError
		if errors.As(err, &refused) || ctx.Err() != nil || c.retryFor == 0 || time.Since(start)+wait > c.retryFor {
			c.closeAll()
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			c.closeAll()
			return nil, fmt.Errorf("%w (not tried again: %w)", err, ctx.Err())
		}
		wait = min(2*wait, retryMaxWait)
	}
}

// topologyStream is an open WatchTopology stream whose first message was
// applied.
type topologyStream struct {
	addr   string
	stream interface{ Recv() (*pb.Topology, error) }
	cancel context.CancelFunc
	opened time.Time
}

// openFirst opens WatchTopology on each of addrs in turn until one sends
// its first message, which it applies. Its error, when none does, says
// what each one did: a *RefusedError (with ErrNotCluster when that was
// the refusal) when one refused the stream, else ErrUnavailable.
func (c *Cluster) openFirst(ctx context.Context, addrs []string) (*topologyStream, error) {
	var (
		why     []string
		refusal error
	)
	for _, addr := range addrs {
		w, err := c.open(ctx, addr)
		if err == nil {
			return w, nil
		}
		if ctx.Err() != nil || c.ctx.Err() != nil {
			return nil, fmt.Errorf("%w: no topology from the cluster: %w", ErrUnavailable, err)
		}
		var r *RefusedError
		if errors.As(err, &r) && refusal == nil {
			refusal = err
		}
		why = append(why, err.Error())
	}
	if refusal != nil {
		return nil, refusal
	}
	return nil, fmt.Errorf("%w: no server of the cluster sent its topology (%s)", ErrUnavailable, strings.Join(why, "; "))
}

// open opens WatchTopology on the server at addr and applies its first
// message. The stream lives until Close (or until it ends); ctx bounds
// only the wait for the first message, as does topologyFirstWait.
func (c *Cluster) open(ctx context.Context, addr string) (*topologyStream, error) {
	cl, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(c.ctx)
	stop := context.AfterFunc(ctx, cancel)
	timer := time.AfterFunc(topologyFirstWait, cancel)
	st, err := cl.rpc.WatchTopology(sctx, &pb.WatchTopologyRequest{})
	var first *pb.Topology
	if err == nil {
		first, err = st.Recv()
	}
	timedOut := !timer.Stop()
	stop()
	if err != nil {
		cancel()
		return nil, c.watchError(ctx, cl, addr, err, timedOut)
	}
	c.apply(first)
	return &topologyStream{addr: addr, stream: st, cancel: cancel, opened: time.Now()}, nil
}

// watchError is the error of a WatchTopology stream on addr that failed
// before its first message.
func (c *Cluster) watchError(ctx context.Context, cl *Client, addr string, err error, timedOut bool) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, addr, ctx.Err())
	case c.ctx.Err() != nil:
		return fmt.Errorf("%w: %w", ErrUnavailable, ErrClosed)
	case timedOut:
		return fmt.Errorf("%w: %s sent no topology within %v", ErrUnavailable, addr, topologyFirstWait)
	}
	err = statusError(ctx, err)
	var r *RefusedError
	if !errors.As(err, &r) {
		// Unavailable, cut off, a limit: worth trying again. Said with
		// the TLS mistake behind it, if any.
		return fmt.Errorf("%s: %w", addr, cl.explain(ctx, err))
	}
	if r.Code == codes.FailedPrecondition {
		return fmt.Errorf("%w: the server at %s is not a member of a cluster, and DialCluster needs the "+
			"addresses of cluster members (Dial connects to a single server): %w", ErrNotCluster, addr, err)
	}
	return fmt.Errorf("the server at %s refused the topology stream: %w", addr, err)
}

// watch follows the topology stream w, and opens another one each time
// the current one ends, until Close.
func (c *Cluster) watch(w *topologyStream) {
	defer close(c.watchDone)
	wait := retryFirstWait
	for {
		for {
			t, err := w.stream.Recv()
			if err != nil {
				break
			}
			c.apply(t)
		}
		w.cancel()
		if time.Since(w.opened) > retryMaxWait {
			// It served a while: the next one starts from the first pause.
			wait = retryFirstWait
		}
		for {
			if !c.pause(wait) {
				return
			}
			wait = min(2*wait, retryMaxWait)
			next, err := c.openFirst(c.ctx, c.candidates(w.addr))
			if err == nil {
				w = next
				break
			}
			if c.ctx.Err() != nil {
				return
			}
		}
	}
}

// pause waits for d; false when the Cluster was closed meanwhile.
func (c *Cluster) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// candidates are the addresses to open the topology stream on after the
// one on last ended: the servers of the last topology, from the one after
// last, then the seeds, last itself at the end.
func (c *Cluster) candidates(last string) []string {
	c.mu.Lock()
	var servers []string
	for _, s := range c.topo.GetServers() {
		if s.GetAddress() != "" {
			servers = append(servers, s.GetAddress())
		}
	}
	c.mu.Unlock()
	if i := slices.Index(servers, last); i >= 0 {
		servers = slices.Concat(servers[i+1:], servers[:i])
	}
	out := make([]string, 0, len(servers)+len(c.seeds)+1)
	for _, a := range append(servers, c.seeds...) {
		if a != last && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return append(out, last)
}

// apply makes t the topology unless it is older than the current one
// (a lagging server's), and sets the free-space estimate of each device
// whose published (free_blocks, epoch) changed to the published figure.
func (c *Cluster) apply(t *pb.Topology) {
	if t == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.topo != nil && (t.GetRevision() < c.topo.GetRevision() || proto.Equal(t, c.topo)) {
		return
	}
	c.topo = t
	c.owners = make(map[string]*pb.ClusterDevice, len(t.GetDevices()))
	for _, d := range t.GetDevices() {
		c.owners[d.GetName()] = d
		s := c.deviceLocked(d.GetName())
		s.epoch = max(s.epoch, d.GetEpoch())
		if !s.published || s.pubFree != d.GetFreeBlocks() || s.pubEpoch != d.GetEpoch() {
			s.published, s.pubFree, s.pubEpoch = true, d.GetFreeBlocks(), d.GetEpoch()
			s.estimate = d.GetFreeBlocks()
		}
	}
	close(c.changed)
	c.changed = make(chan struct{})
}

// deviceLocked is the state of device name, made on first use (c.mu held).
func (c *Cluster) deviceLocked(name string) *clusterDevice {
	s := c.devs[name]
	if s == nil {
		s = &clusterDevice{}
		c.devs[name] = s
	}
	return s
}

// Topology is the newest topology of the cluster this Cluster has seen.
// It is shared: do not modify it.
func (c *Cluster) Topology() *pb.Topology {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.topo
}

// Watch is the newest topology (as Topology) and a channel that is closed
// when a newer one replaces it:
//
//	for {
//		t, changed := c.Watch()
//		use(t)
//		select {
//		case <-changed:
//		case <-ctx.Done():
//			return
//		}
//	}
func (c *Cluster) Watch() (*pb.Topology, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.topo, c.changed
}

// conn is the connection to the server at addr, dialled on first use.
func (c *Cluster) conn(addr string) (*Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, ErrClosed)
	}
	if cl := c.conns[addr]; cl != nil {
		return cl, nil
	}
	cl, err := Dial(addr, c.opts)
	if err != nil {
		return nil, err
	}
	c.conns[addr] = cl
	return cl, nil
}

// Close stops following the topology and closes every connection; calls
// in flight fail with ErrUnavailable (ErrClosed), or ErrOutcomeUnknown
// when they were sent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	already := c.closed
	c.mu.Unlock()
	if already {
		return nil
	}
	c.cancel()
	<-c.watchDone
	c.closeAll()
	return nil
}

// closeAll closes every connection; no other is made after it.
func (c *Cluster) closeAll() {
	c.cancel()
	c.mu.Lock()
	c.closed = true
	conns := c.conns
	c.conns = map[string]*Client{}
	c.mu.Unlock()
	for _, cl := range conns {
		_ = cl.Close()
	}
}

// requestID is a new request id: never 0 (which asks for no retry
// protection), with retries off too (as Client.requestID).
func (c *Cluster) requestID() uint64 {
	for {
		if id := c.lastRequest.Add(1); id != 0 {
			return id
		}
	}
}

// owner is the device's owner now (nil when it has none), the newest epoch
// known for it, the channel closed when the topology changes, and the
// topology's revision. The error, a *RefusedError with NOT_FOUND, says
// that no server of the topology lists the device: neither as a device it
// owns nor among the devices it can serve.
func (c *Cluster) owner(device string) (*pb.ClusterDevice, uint64, <-chan struct{}, uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var epoch uint64
	if s := c.devs[device]; s != nil {
		epoch = s.epoch
	}
	d := c.owners[device]
	if d == nil && !slices.ContainsFunc(c.topo.GetServers(), func(s *pb.ClusterServer) bool {
		return slices.Contains(s.GetDevices(), device)
	}) {
		return nil, 0, nil, 0, &RefusedError{Code: codes.NotFound,
			Reason: fmt.Sprintf("no server of cluster %q has device %q", c.topo.GetCluster(), device)}
	}
	return d, epoch, c.changed, c.topo.GetRevision(), nil
}

// observe notes the device's epoch from a reply: a fenced error when it is
// older than the newest known (the reply came from a stale owner). 0 (a
// server without epochs) says nothing.
func (c *Cluster) observe(device string, epoch uint64) error {
	if epoch == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.deviceLocked(device)
	if epoch < s.epoch {
		return fencedReply(epoch, s.epoch)
	}
	s.epoch = epoch
	return nil
}

// retryable says whether a routed call that failed with err is sent
// again: it did not run, it may have run (the owner of the moment answers
// its id with the first result), or a stale owner answered; not when ctx
// ended or the Cluster was closed.
func (c *Cluster) retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil || c.ctx.Err() != nil || errors.Is(err, ErrClosed) {
		return false
	}
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown)
}

// route runs attempt (one sending of a call on device, with the same
// request each time) on the device's owner of the moment, with the
// newest epoch known for the device, until it succeeds or fails in a way
// that sending it again cannot help (see Cluster), for at most c.retryFor;
// a device that no server lists fails it at once (see owner). It returns
// the reply's epoch.
func (c *Cluster) route(ctx context.Context, device string,
	attempt func(cl *Client, epoch uint64) (replyEpoch uint64, err error),
) (uint64, error) {
	start := time.Now()
	wait := retryFirstWait
	explained := false
	for {
		d, epoch, changed, revision, err := c.owner(device)
		switch {
		case c.ctx.Err() != nil:
			return 0, fmt.Errorf("%w: %w", ErrUnavailable, ErrClosed)
		case err != nil:
			return 0, err
		case d == nil:
			err = fmt.Errorf("%w: device %q has no owner in the cluster's topology (revision %d): "+
				"between owners (a server lists it, none owns it now)", ErrUnavailable, device, revision)
		default:
			var cl *Client
			if cl, err = c.conn(d.GetAddress()); err != nil {
				break
			}
			var got uint64
			if got, err = attempt(cl, epoch); err == nil {
				if err = c.observe(device, got); err == nil {
					return got, nil
				}
			} else if !explained {
				// A TLS mistake of the client's settings fails every
				// sending: said at once (see explain), not after RetryFor.
				explained = true
				if e := cl.explain(ctx, err); e != err {
					return 0, e
				}
			}
			if err != nil {
				err = fmt.Errorf("device %q on %s (%s): %w", device, d.GetServer(), d.GetAddress(), err)
			}
		}
		if !c.retryable(ctx, err) || c.retryFor == 0 || time.Since(start)+wait > c.retryFor {
			return 0, err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-changed:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return 0, fmt.Errorf("%w (not sent again: %w)", err, ctx.Err())
		case <-c.ctx.Done():
			t.Stop()
			return 0, fmt.Errorf("%w (not sent again: %w)", err, ErrClosed)
		}
		wait = min(2*wait, retryMaxWait)
	}
}

func deviceRef(name string) *pb.DeviceRef {
	return &pb.DeviceRef{Ref: &pb.DeviceRef_Name{Name: name}}
}

// AllocateOn allocates count contiguous objects of blocks blocks each on
// device (ClusterDevice.name), all or nothing, at the device's owner of
// the moment; durable when it returns. Errors are those of
// Client.AllocateMany, and a *RefusedError with NOT_FOUND for a device
// that no server of the cluster lists; a call that did not get through is
// sent again as Cluster says.
func (c *Cluster) AllocateOn(ctx context.Context, device string, count uint32, blocks uint64) ([]Extent, error) {
	es, _, err := c.allocateOn(ctx, device, count, blocks)
	return es, err
}

// allocateOn is AllocateOn, with the epoch of the device that allocated.
func (c *Cluster) allocateOn(ctx context.Context, device string, count uint32, blocks uint64) ([]Extent, uint64, error) {
	if _, err := needed(count, blocks); err != nil {
		return nil, 0, err
	}
	id := c.requestID()
	var r *pb.AllocateResponse
	epoch, err := c.route(ctx, device, func(cl *Client, epoch uint64) (uint64, error) {
		req := &pb.AllocateRequest{
			Device:    deviceRef(device),
			Count:     count,
			Size:      &pb.AllocateRequest_Blocks{Blocks: blocks},
			RequestId: id,
			Epoch:     epoch,
		}
		var err error
		r, err = viaCalls(ctx, cl.calls, &pb.CallRequest{Call: &pb.CallRequest_Allocate{Allocate: req}},
			(*pb.CallReply).GetAllocate,
			func() (*pb.AllocateResponse, error) { return cl.rpc.Allocate(ctx, req) })
		if err != nil {
			return 0, err
		}
		return r.Epoch, nil
	})
	if err != nil {
		return nil, 0, err
	}
	out, err := contiguous(r, count, blocks)
	if err != nil {
		return nil, 0, err
	}
	c.mu.Lock()
	s := c.deviceLocked(device)
	s.estimate = r.GetFreeBlocks()
	if epoch == 0 {
		epoch = s.epoch
	}
	c.mu.Unlock()
	return out, epoch, nil
}

// needed is count objects of blocks blocks in blocks, or why not.
func needed(count uint32, blocks uint64) (uint64, error) {
	if count == 0 || blocks == 0 {
		return 0, invalid("cannot allocate %d objects of %d blocks: both must be at least 1", count, blocks)
	}
	hi, need := bits.Mul64(uint64(count), blocks)
	if hi != 0 {
		return 0, invalid("cannot allocate %d objects of %d blocks: more blocks than a device can hold", count, blocks)
	}
	return need, nil
}

// Free frees committed extents of device (pairwise disjoint, at most
// MaxBatch), all or nothing, at the device's owner of the moment; durable
// when it returns. It returns the blocks freed. A call that did not get
// through is sent again as Cluster says; a device that no server of the
// cluster lists fails it at once (a *RefusedError with NOT_FOUND).
func (c *Cluster) Free(ctx context.Context, device string, extents ...Extent) (uint64, error) {
	if len(extents) == 0 {
		return 0, nil
	}
	es := toPBs(extents)
	id := c.requestID()
	var r *pb.FreeResponse
	_, err := c.route(ctx, device, func(cl *Client, epoch uint64) (uint64, error) {
		req := &pb.FreeRequest{Device: deviceRef(device), Extents: es, RequestId: id, Epoch: epoch}
		var err error
		r, err = viaCalls(ctx, cl.calls, &pb.CallRequest{Call: &pb.CallRequest_Free{Free: req}},
			(*pb.CallReply).GetFree,
			func() (*pb.FreeResponse, error) { return cl.rpc.Free(ctx, req) })
		if err != nil {
			return 0, err
		}
		return r.Epoch, nil
	})
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	c.deviceLocked(device).estimate = r.GetFreeBlocks()
	c.mu.Unlock()
	return r.Blocks, nil
}

// Placement says which devices of the cluster an allocation may go to,
// and which it prefers.
type Placement struct {
	// Labels, "key=value" each: a device qualifies when every one is among
	// its labels (ClusterDevice.labels: its owner's, and "server=NAME").
	// None: every device qualifies.
	Labels []string
	// MaxUsed is the fraction of a device's capacity that may be in use
	// after the allocation, for the device to be preferred: devices above
	// it are used only when no device below it has room. 0 means
	// DefaultMaxUsed.
	MaxUsed float64
}

// Placed is where an allocation was placed.
type Placed struct {
	// Device is the device's name (ClusterDevice.name): free the extents
	// there.
	Device string
	// Epoch is the device's epoch when it allocated them.
	Epoch uint64
	// Extents are the objects, in order, each one contiguous extent.
	Extents []Extent
}

// Allocate allocates count contiguous objects of blocks blocks each on one
// device of the cluster that place admits, all or nothing; durable when it
// returns.
//
// The Cluster reckons each device's free blocks: the figure the topology
// last published for it (its owner publishes its space about once a
// second at most; a different figure or epoch is taken at once), or the
// device's free blocks that its last Allocate or Free reply to this
// Cluster carried (AllocateResponse.free_blocks, FreeResponse.free_blocks;
// replayed replies too), whichever came later. With need = count*blocks,
// the devices eligible are those whose space is known, whose capacity is
// not 0, that carry every label of place, and whose reckoned free blocks
// are at least need; the preferred ones among them would be at most
// place.MaxUsed full after the allocation. It picks among the preferred
// devices, or among the eligible ones when none is preferred: two devices
// drawn at random, independently, each with probability proportional to
// its free blocks, and of the two the one with the larger free fraction
// (free blocks / capacity), the first drawn on a tie. The draw fills each
// device in proportion to its free space, which keeps used fractions
// level across devices of different sizes; the second choice pulls back a
// device that got ahead (the power of two choices: without every client
// choosing the same one). A device that answers that it has no room
// (ErrNoSpace; not a quota refusal) is reckoned full and another one is
// picked, each device at most once per call. Devices whose space is not
// published yet (just taken over) come last: one at random when no other
// has room. When no device is eligible
// the error is a *NoSpaceError (ErrNoSpace). Other errors are
// AllocateOn's, from the device picked.
//
//	p, err := c.Allocate(ctx, blockalloc.Placement{Labels: []string{"zone=a"}}, 4, 256)
//	if errors.Is(err, blockalloc.ErrNoSpace) {
//		// no device in zone a has 1024 free blocks
//	}
func (c *Cluster) Allocate(ctx context.Context, place Placement, count uint32, blocks uint64) (Placed, error) {
	need, err := needed(count, blocks)
	if err != nil {
		return Placed{}, err
	}
	maxUsed := place.MaxUsed
	if maxUsed == 0 {
		maxUsed = DefaultMaxUsed
	}
	tried := make(map[string]bool)
	var refusals []string
	for {
		device, cluster := c.place(place.Labels, maxUsed, need, tried)
		if device == "" {
			return Placed{}, c.noDevice(cluster, place, need, refusals)
		}
		tried[device] = true
		es, epoch, err := c.allocateOn(ctx, device, count, blocks)
		if err == nil {
			return Placed{Device: device, Epoch: epoch, Extents: es}, nil
		}
		var ns *NoSpaceError
		if !errors.As(err, &ns) || errors.Is(err, ErrQuota) {
			return Placed{}, err
		}
		c.mu.Lock()
		c.deviceLocked(device).estimate = 0
		c.mu.Unlock()
		refusals = append(refusals, fmt.Sprintf("%s: %s", device, ns.Reason))
	}
}

// noDevice is Allocate's error when no device is eligible.
func (c *Cluster) noDevice(cluster string, place Placement, need uint64, refusals []string) error {
	labels := "any labels"
	if len(place.Labels) > 0 {
		labels = "labels " + strings.Join(place.Labels, ", ")
	}
	msg := fmt.Sprintf("no device of cluster %q matching the placement (%s) has %d free blocks", cluster, labels, need)
	if len(refusals) > 0 {
		msg += " (refused for want of space: " + strings.Join(refusals, "; ") + ")"
	}
	return &NoSpaceError{Reason: msg}
}

// place picks the device for an allocation of need blocks among those not
// tried yet (see Allocate); "" when none is eligible. It also returns the
// cluster's name.
func (c *Cluster) place(labels []string, maxUsed float64, need uint64, tried map[string]bool) (string, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	type candidate struct {
		name     string
		estimate uint64
		// fraction is estimate / capacity.
		fraction float64
	}
	var eligible, preferred []candidate
	// Devices whose space is not published yet (just taken over).
	var unknown []string
	for _, d := range c.topo.GetDevices() {
		if tried[d.GetName()] || !hasLabels(d.GetLabels(), labels) {
			continue
		}
		if !d.GetSpaceKnown() {
			unknown = append(unknown, d.GetName())
			continue
		}
		if d.GetCapacityBlocks() == 0 {
			continue
		}
		s := c.deviceLocked(d.GetName())
		if s.estimate < need {
			continue
		}
		capacity := float64(d.GetCapacityBlocks())
		x := candidate{name: d.GetName(), estimate: s.estimate, fraction: float64(s.estimate) / capacity}
		eligible = append(eligible, x)
		if capacity-float64(s.estimate)+float64(need) <= maxUsed*capacity {
			preferred = append(preferred, x)
		}
	}
	from := preferred
	if len(from) == 0 {
		from = eligible
	}
	if len(from) == 0 {
		// The last resort: a device that may have room (its owner refuses
		// if not).
		if len(unknown) == 0 {
			return "", c.topo.GetCluster()
		}
		return unknown[c.rng.IntN(len(unknown))], c.topo.GetCluster()
	}
	// The topology's order is the server's: by name, the same draws pick
	// the same devices.
	slices.SortFunc(from, func(a, b candidate) int { return strings.Compare(a.name, b.name) })
	weights := make([]uint64, len(from))
	for i, x := range from {
		weights[i] = x.estimate
	}
	// Two independent draws by free blocks; the emptier by fraction is
	// taken, the first on a tie.
	first, second := from[draw(c.rng, weights)], from[draw(c.rng, weights)]
	if second.fraction > first.fraction {
		first = second
	}
	return first.name, c.topo.GetCluster()
}

// hasLabels reports whether every label of want is among have.
func hasLabels(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// draw is an index of weights drawn with probability proportional to its
// weight (weights are not all 0).
func draw(rng *rand.Rand, weights []uint64) int {
	shift := uint(0)
	var total uint64
	for {
		total = 0
		overflow := false
		for _, w := range weights {
			var carry uint64
			total, carry = bits.Add64(total, w>>shift, 0)
			if carry != 0 {
				overflow = true
				break
			}
		}
		if !overflow {
			break
		}
		shift++
	}
	if total == 0 {
		return rng.IntN(len(weights))
	}
	r := rng.Uint64N(total)
	for i, w := range weights {
		if r < w>>shift {
			return i
		}
		r -= w >> shift
	}
	return len(weights) - 1
}
