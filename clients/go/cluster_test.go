package blockalloc

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// fakeCluster is what the fake members of a cluster share: the topology
// they all stream (as their etcd holds it) and the devices, whose space
// and request ids outlive a change of owner (as the device's store and
// journal do: a new owner replays the journal's ids).
type fakeCluster struct {
	mu      sync.Mutex
	topo    *pb.Topology
	changed chan struct{}
	devices map[string]*fakeDevice
	members []*fakeMember
}

// fakeDevice is one device's space and request ids.
type fakeDevice struct {
	free uint64 // blocks the device really has free
	next uint64 // the next block handed out
	ids  map[uint64]proto.Message
	ran  map[string]int // calls that ran (replays not counted), by method
}

// fakeCall is one request a member received.
type fakeCall struct {
	method, device string
	id, epoch      uint64
}

// fakeMember is one server of a fake cluster. It serves WatchTopology
// from the cluster's topology, and Allocate and Free on the devices the
// topology gives it, keeping request ids as the schema says; its replies,
// replayed ones too, carry the device's free blocks just after the call,
// as a server's do. It has no Calls stream, so the client's calls go
// unary. The hooks run with c.mu held.
type fakeMember struct {
	pb.UnimplementedAllocatorServer
	c    *fakeCluster
	name string
	addr string
	g    *grpc.Server

	// All below under c.mu.
	// owns are the devices it owns now and their epochs.
	owns map[string]uint64
	// notCluster: WatchTopology answers FAILED_PRECONDITION.
	notCluster bool
	// refuse, when set, is asked before a call runs (method, its receipt
	// count from 1): an error to answer instead.
	refuse func(method string, n int) error
	// lost, when set, is asked after a call ran: an error to answer
	// instead of the reply, as if it were lost.
	lost func(method string, n int) error
	// stale, when set, is asked before each reply: a nonzero epoch to
	// put in it instead of the device's.
	stale    func(method string, n int) uint64
	received []fakeCall
	watches  int
}

func newFakeCluster() *fakeCluster {
	return &fakeCluster{changed: make(chan struct{}), devices: make(map[string]*fakeDevice)}
}

// member serves a new member named name until the test ends.
func (c *fakeCluster) member(t *testing.T, name string) *fakeMember {
	t.Helper()
	m := &fakeMember{c: c, name: name, owns: make(map[string]uint64)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.addr = ln.Addr().String()
	m.g = grpc.NewServer()
	pb.RegisterAllocatorServer(m.g, m)
	go func() { _ = m.g.Serve(ln) }()
	t.Cleanup(m.g.Stop)
	c.mu.Lock()
	c.members = append(c.members, m)
	c.mu.Unlock()
	return m
}

// fakeDev is a device of a topology, owned by m.
func fakeDev(name string, m *fakeMember, epoch, capacity, free uint64, labels ...string) *pb.ClusterDevice {
	return &pb.ClusterDevice{
		Name: name, Server: m.name, Address: m.addr, Epoch: epoch, SpaceKnown: true, BlockSize: 4096,
		CapacityBlocks: capacity, FreeBlocks: free, Labels: append(labels, "server="+m.name),
	}
}

// topology is a topology of revision rev with the servers and devices;
// each server lists the devices it owns in it.
func topology(rev uint64, servers []*fakeMember, devices ...*pb.ClusterDevice) *pb.Topology {
	t := &pb.Topology{Revision: rev, Cluster: "test", Devices: devices}
	for _, m := range servers {
		s := &pb.ClusterServer{Name: m.name, Address: m.addr, Version: Version}
		for _, d := range devices {
			if d.Server == m.name {
				s.Devices = append(s.Devices, d.Name)
			}
		}
		t.Servers = append(t.Servers, s)
	}
	return t
}

// listing is t with server also listing devices among those it can serve
// (a standby's, or ones between owners).
func listing(t *pb.Topology, server string, devices ...string) *pb.Topology {
	for _, s := range t.Servers {
		if s.Name == server {
			s.Devices = append(s.Devices, devices...)
		}
	}
	return t
}

// publish makes t the cluster's topology: its devices' owners own them at
// its epochs, other members do not; a device seen first gets the free
// blocks t says it has.
func (c *fakeCluster) publish(t *pb.Topology) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.publishLocked(t)
}

func (c *fakeCluster) publishLocked(t *pb.Topology) {
	for _, m := range c.members {
		clear(m.owns)
	}
	for _, d := range t.Devices {
		for _, m := range c.members {
			if m.name == d.Server {
				m.owns[d.Name] = d.Epoch
			}
		}
		if c.devices[d.Name] == nil {
			c.devices[d.Name] = &fakeDevice{
				free: d.FreeBlocks, next: 1 << 20,
				ids: make(map[uint64]proto.Message), ran: make(map[string]int),
			}
		}
	}
	c.topo = t
	close(c.changed)
	c.changed = make(chan struct{})
}

// free is how many blocks device has free.
func (c *fakeCluster) free(device string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.devices[device].free
}

func (c *fakeCluster) setFree(device string, blocks uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.devices[device].free = blocks
}

// firstResult is the result the device keeps for request id.
func (c *fakeCluster) firstResult(device string, id uint64) proto.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.devices[device].ids[id]
}

// runs is how many calls of method ran on device.
func (c *fakeCluster) runs(device, method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.devices[device].ran[method]
}

// calls are the requests of method m received.
func (m *fakeMember) calls(method string) []fakeCall {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	var out []fakeCall
	for _, r := range m.received {
		if r.method == method {
			out = append(out, r)
		}
	}
	return out
}

func (m *fakeMember) watchCount() int {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.watches
}

func (m *fakeMember) set(f func()) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	f()
}

func (m *fakeMember) WatchTopology(_ *pb.WatchTopologyRequest, st grpc.ServerStreamingServer[pb.Topology]) error {
	c := m.c
	c.mu.Lock()
	m.watches++
	notCluster := m.notCluster
	c.mu.Unlock()
	if notCluster {
		return status.Error(codes.FailedPrecondition, "this server is not in a cluster (serve --etcd ENDPOINTS --cluster NAME)")
	}
	var sent *pb.Topology
	for {
		c.mu.Lock()
		t, changed := c.topo, c.changed
		c.mu.Unlock()
		if t != nil && t != sent {
			if err := st.Send(t); err != nil {
				return err
			}
			sent = t
		}
		select {
		case <-changed:
		case <-st.Context().Done():
			return nil
		}
	}
}

// begin records a call and checks that m owns the device at an epoch no
// older than the request's (c.mu held): the device and the call's receipt
// count, or the error to answer.
func (m *fakeMember) begin(method, device string, id, epoch uint64) (*fakeDevice, int, uint64, error) {
	m.received = append(m.received, fakeCall{method: method, device: device, id: id, epoch: epoch})
	n := 0
	for _, r := range m.received {
		if r.method == method {
			n++
		}
	}
	if m.refuse != nil {
		if err := m.refuse(method, n); err != nil {
			return nil, n, 0, err
		}
	}
	own, ok := m.owns[device]
	if !ok {
		return nil, n, 0, status.Errorf(codes.Unavailable, "device %q is not served by %s now", device, m.name)
	}
	if epoch > own {
		return nil, n, 0, status.Errorf(codes.Unavailable, "fenced: epoch %d asked, %d here", epoch, own)
	}
	return m.c.devices[device], n, own, nil
}

func (m *fakeMember) replyEpoch(method string, n int, own uint64) uint64 {
	if m.stale != nil {
		if e := m.stale(method, n); e != 0 {
			return e
		}
	}
	return own
}

func (m *fakeMember) Allocate(_ context.Context, r *pb.AllocateRequest) (*pb.AllocateResponse, error) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	d, n, own, err := m.begin("Allocate", r.GetDevice().GetName(), r.RequestId, r.Epoch)
	if err != nil {
		return nil, err
	}
	if first, ok := d.ids[r.RequestId]; ok && r.RequestId != 0 {
		out := proto.Clone(first).(*pb.AllocateResponse)
		out.Replayed = true
		out.Epoch = m.replyEpoch("Allocate", n, own)
		out.FreeBlocks = d.free
		return out, nil
	}
	need := uint64(r.Count) * r.GetBlocks()
	if need > d.free {
		return nil, status.Errorf(codes.ResourceExhausted, "no space: %d blocks asked, %d free", need, d.free)
	}
	d.free -= need
	d.ran["Allocate"]++
	out := &pb.AllocateResponse{BlockSize: 4096}
	for range r.Count {
		out.Objects = append(out.Objects, &pb.Object{Extents: []*pb.Extent{{Start: d.next, Len: r.GetBlocks()}}})
		d.next += r.GetBlocks()
	}
	if r.RequestId != 0 {
		d.ids[r.RequestId] = proto.Clone(out)
	}
	if m.lost != nil {
		if err := m.lost("Allocate", n); err != nil {
			return nil, err
		}
	}
	out.Epoch = m.replyEpoch("Allocate", n, own)
	out.FreeBlocks = d.free
	return out, nil
}

func (m *fakeMember) Free(_ context.Context, r *pb.FreeRequest) (*pb.FreeResponse, error) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	d, n, own, err := m.begin("Free", r.GetDevice().GetName(), r.RequestId, r.Epoch)
	if err != nil {
		return nil, err
	}
	if first, ok := d.ids[r.RequestId]; ok && r.RequestId != 0 {
		out := proto.Clone(first).(*pb.FreeResponse)
		out.Replayed = true
		out.Epoch = m.replyEpoch("Free", n, own)
		out.FreeBlocks = d.free
		return out, nil
	}
	out := &pb.FreeResponse{Blocks: sumLen(extentsOf(r.Extents))}
	d.free += out.Blocks
	d.ran["Free"]++
	if r.RequestId != 0 {
		d.ids[r.RequestId] = proto.Clone(out)
	}
	if m.lost != nil {
		if err := m.lost("Free", n); err != nil {
			return nil, err
		}
	}
	out.Epoch = m.replyEpoch("Free", n, own)
	out.FreeBlocks = d.free
	return out, nil
}

// dialCluster dials the cluster with seeds, with its random draws seeded,
// and closes it when the test ends.
func dialCluster(t *testing.T, seeds []string, opts Options) *Cluster {
	t.Helper()
	c, err := DialCluster(ctxT(t), seeds, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	c.mu.Lock()
	c.rng = rand.New(rand.NewPCG(1, 2))
	c.mu.Unlock()
	return c
}

// waitRevision waits until c has seen a topology of revision rev or later.
func waitRevision(t *testing.T, c *Cluster, rev uint64) {
	t.Helper()
	ctx := ctxT(t)
	for {
		topo, changed := c.Watch()
		if topo.GetRevision() >= rev {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("revision %d never came (at %d)", rev, topo.GetRevision())
		}
	}
}

func (c *Cluster) estimate(device string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deviceLocked(device).estimate
}

// noRetry makes c send each call once (as Options.RetryFor NoRetry does,
// which would also give DialCluster a single try).
func noRetry(c *Cluster) { c.retryFor = 0 }

// deadAddr is an address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// The topology comes from the first seed that answers: a dead first seed
// is passed over. With no seed answering, DialCluster fails with
// ErrUnavailable.
func TestClusterDiscoveryPassesOverADeadSeed(t *testing.T) {
	fc := newFakeCluster()
	m1, m2 := fc.member(t, "s1"), fc.member(t, "s2")
	fc.publish(topology(4, []*fakeMember{m1, m2}, fakeDev("d1", m2, 3, 1000, 1000)))
	dead := deadAddr(t)
	c := dialCluster(t, []string{dead, m1.addr, m2.addr}, Options{})
	if got := c.Topology(); got.GetRevision() != 4 || got.GetCluster() != "test" || len(got.GetDevices()) != 1 {
		t.Fatalf("topology %v; want revision 4 of cluster test with one device", got)
	}
	if m1.watchCount() != 1 || m2.watchCount() != 0 {
		t.Fatalf("WatchTopology asked %d times of the first live seed and %d of the second; want once and never",
			m1.watchCount(), m2.watchCount())
	}
	// Calls go to the device's owner, by name.
	es, err := c.AllocateOn(ctxT(t), "d1", 2, 8)
	if err != nil || len(es) != 2 || es[0].Len != 8 {
		t.Fatalf("AllocateOn: %v, %v", es, err)
	}
	if got := m2.calls("Allocate"); len(got) != 1 || got[0].device != "d1" || got[0].epoch != 3 || got[0].id == 0 {
		t.Fatalf("the owner received %+v; want one Allocate of d1 at epoch 3 with a request id", got)
	}

	_, err = DialCluster(ctxT(t), []string{dead, deadAddr(t)}, Options{RetryFor: NoRetry})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), dead) {
		t.Fatalf("DialCluster with no live seed: %v; want ErrUnavailable naming the seeds", err)
	}
}

// A server that is not in a cluster answers WatchTopology with
// FAILED_PRECONDITION: DialCluster says so at once, without asking again.
func TestClusterDialOfAServerNotInAClusterFails(t *testing.T) {
	fc := newFakeCluster()
	solo := fc.member(t, "solo")
	solo.set(func() { solo.notCluster = true })
	_, err := DialCluster(ctxT(t), []string{solo.addr}, Options{})
	var r *RefusedError
	if !errors.Is(err, ErrNotCluster) || !errors.As(err, &r) || r.Code != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), solo.addr) || !strings.Contains(err.Error(), "not in a cluster") {
		t.Fatalf("DialCluster of a server not in a cluster: %v; want ErrNotCluster, a FAILED_PRECONDITION "+
			"*RefusedError naming the server", err)
	}
	if n := solo.watchCount(); n != 1 {
		t.Fatalf("WatchTopology asked %d times; want once", n)
	}
	// Another seed that is a member still serves.
	m := fc.member(t, "s1")
	fc.publish(topology(1, []*fakeMember{m}))
	c := dialCluster(t, []string{solo.addr, m.addr}, Options{})
	if c.Topology().GetRevision() != 1 {
		t.Fatalf("topology %v", c.Topology())
	}
}

// When the stream's server stops, the stream is opened again on another
// server of the topology, and later topologies come from there. An older
// revision never replaces a newer one.
func TestClusterTopologyStreamReconnects(t *testing.T) {
	fc := newFakeCluster()
	m1, m2 := fc.member(t, "s1"), fc.member(t, "s2")
	fc.publish(topology(5, []*fakeMember{m1, m2}, fakeDev("d1", m1, 1, 1000, 1000)))
	c := dialCluster(t, []string{m1.addr}, Options{})
	if c.Topology().GetRevision() != 5 || m1.watchCount() != 1 {
		t.Fatalf("revision %d, %d streams on the seed", c.Topology().GetRevision(), m1.watchCount())
	}
	m1.g.Stop()
	// s1 died: s2 takes its device over.
	fc.publish(topology(6, []*fakeMember{m2}, fakeDev("d1", m2, 2, 1000, 1000)))
	waitRevision(t, c, 6)
	if m2.watchCount() == 0 {
		t.Fatal("revision 6 came without a stream on s2")
	}
	if _, err := c.AllocateOn(ctxT(t), "d1", 1, 1); err != nil {
		t.Fatalf("AllocateOn after the takeover: %v", err)
	}
	if got := m2.calls("Allocate"); len(got) != 1 || got[0].epoch != 2 {
		t.Fatalf("s2 received %+v; want one Allocate at epoch 2", got)
	}

	// An older revision (a lagging server's) is not taken; a newer one is.
	_, changed := c.Watch()
	c.apply(topology(3, []*fakeMember{m1}))
	if got := c.Topology().GetRevision(); got != 6 {
		t.Fatalf("revision %d after an older one came; want 6", got)
	}
	select {
	case <-changed:
		t.Fatal("an older revision woke the watchers")
	default:
	}
	c.apply(topology(7, []*fakeMember{m2}))
	<-changed
	if got := c.Topology().GetRevision(); got != 7 {
		t.Fatalf("revision %d; want 7", got)
	}
}

// Allocations spread over the devices that match the placement, in
// proportion to their free space, more on the emptier by fraction; never
// on one without the labels, one whose space or capacity is unknown, nor
// on one that the allocation would leave fuller than MaxUsed while others
// have room (but there when only it has room).
func TestClusterPlacementSpreadsByFreeSpace(t *testing.T) {
	fc := newFakeCluster()
	m1, m2 := fc.member(t, "s1"), fc.member(t, "s2")
	const M = 1_000_000
	unknown := fakeDev("unk", m1, 1, 10*M, 10*M, "zone=a")
	unknown.SpaceKnown = false
	fc.publish(topology(1, []*fakeMember{m1, m2},
		// Free fractions 0.5, 0.5 and 0.75; free blocks 0.5M, 2M, 1.5M.
		fakeDev("a1", m1, 1, 1*M, M/2, "zone=a"),
		fakeDev("a2", m2, 1, 4*M, 2*M, "zone=a"),
		fakeDev("a3", m1, 1, 2*M, 3*M/2, "zone=a"),
		fakeDev("b1", m2, 1, 10*M, 8*M, "zone=b"),
		// 97% used after an allocation: over MaxUsed.
		fakeDev("nf", m2, 1, 1*M, 30_000, "zone=a", "disk=nf"),
		fakeDev("cap0", m2, 1, 0, 10*M, "zone=a"),
		unknown,
	))
	c := dialCluster(t, []string{m1.addr}, Options{})
	ctx := ctxT(t)
	place := Placement{Labels: []string{"zone=a"}}
	counts := map[string]int{}
	const n = 1000
	for range n {
		p, err := c.Allocate(ctx, place, 1, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Extents) != 1 || p.Extents[0].Len != 4 || p.Epoch != 1 {
			t.Fatalf("placed %+v", p)
		}
		counts[p.Device]++
	}
	t.Logf("placements: %v", counts)
	for _, d := range []string{"b1", "nf", "cap0", "unk"} {
		if counts[d] != 0 {
			t.Fatalf("placements %v: some on %s (zone b, over MaxUsed, capacity 0 or space unknown)", counts, d)
		}
	}
	// Draws by free blocks (1/8, 1/2, 3/8), the larger free fraction of
	// two kept, the first on a tie: about 7.8%, 31.3% and 60.9%, more on
	// a2 than a1 (as much emptier, 4 times the free blocks), most on a3
	// (the emptiest, though a2 has more free blocks). Each gap is over 10
	// standard deviations.
	if !(0 < counts["a1"] && counts["a1"] < counts["a2"] && counts["a2"] < counts["a3"]) {
		t.Fatalf("placements %v; want 0 < a1 < a2 < a3", counts)
	}
	for _, d := range []string{"a1", "a2", "a3"} {
		want := fc.free(d)
		if got := c.estimate(d); got != want {
			t.Fatalf("%s: reckoned %d free blocks, has %d", d, got, want)
		}
	}

	// From many goroutines at once.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	var mu sync.Mutex
	for range 8 {
		wg.Go(func() {
			for range 25 {
				p, err := c.Allocate(ctx, place, 2, 3)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				counts[p.Device]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, d := range []string{"b1", "nf", "cap0", "unk"} {
		if counts[d] != 0 {
			t.Fatalf("placements %v: some on %s", counts, d)
		}
	}

	// Only nf has the label: used, though over MaxUsed.
	p, err := c.Allocate(ctx, Placement{Labels: []string{"disk=nf"}}, 1, 4)
	if err != nil || p.Device != "nf" {
		t.Fatalf("Allocate on disk=nf: %+v, %v", p, err)
	}
	// A new publication resets the reckoning.
	fc.publish(topology(2, []*fakeMember{m1, m2}, fakeDev("a1", m1, 1, 4*M, 123, "zone=a")))
	waitRevision(t, c, 2)
	if got := c.estimate("a1"); got != 123 {
		t.Fatalf("a1 reckoned at %d free blocks after a publication of 123", got)
	}
}

// The choice itself, over many draws from fixed estimates: two devices
// drawn independently, each with probability proportional to its free
// blocks, and of the two the one with the larger free fraction, the first
// drawn on a tie. Devices with capacity 0 are never candidates; those with
// space unknown only as a last resort.
func TestClusterPlacementTakesTheEmptierByFractionOfTwoDraws(t *testing.T) {
	m := &fakeMember{name: "s1", addr: "127.0.0.1:1"}
	const M = 1_000_000
	unknown := fakeDev("unk", m, 1, 10*M, 10*M, "zone=a", "only=odd")
	unknown.SpaceKnown = false
	c := &Cluster{changed: make(chan struct{}), devs: make(map[string]*clusterDevice), rng: rand.New(rand.NewPCG(3, 4))}
	c.apply(topology(1, []*fakeMember{m},
		// Weights 1/8, 1/2, 3/8; free fractions 0.5, 0.5, 0.75.
		fakeDev("a1", m, 1, 1*M, M/2, "zone=a"),
		fakeDev("a2", m, 1, 4*M, 2*M, "zone=a"),
		fakeDev("a3", m, 1, 2*M, 3*M/2, "zone=a"),
		fakeDev("cap0", m, 1, 0, 10*M, "zone=a", "only=odd"),
		unknown,
		// The same free blocks; free fractions 0.5 and 0.25.
		fakeDev("b1", m, 1, 1*M, M/2, "zone=b"),
		fakeDev("b2", m, 1, 2*M, M/2, "zone=b"),
		// Weights 1/4, 3/4; the same free fraction 0.25.
		fakeDev("c1", m, 1, 1*M, M/4, "zone=c"),
		fakeDev("c2", m, 1, 3*M, 3*M/4, "zone=c"),
	))
	// Capacity 0 is never a candidate; space unknown only when no device
	// with known space has room.
	if got, _ := c.place([]string{"only=odd"}, DefaultMaxUsed, 1, map[string]bool{}); got != "unk" {
		t.Fatalf("placed on %q; want unk, the one device that may have room", got)
	}
	if got, _ := c.place([]string{"only=odd"}, DefaultMaxUsed, 1, map[string]bool{"unk": true}); got != "" {
		t.Fatalf("placed on %q; want no device: capacity 0 is never a candidate", got)
	}
	if got, _ := c.place([]string{"zone=a"}, DefaultMaxUsed, 1, map[string]bool{}); got == "unk" {
		t.Fatalf("placed on %q while devices with known space have room", got)
	}
	// 100000 draws: each share within 0.02 of its probability, more than
	// 13 standard deviations; the rules set aside are further off (more
	// free blocks of the two: a2 0.75, b1 0.5, c2 0.9375).
	const n = 100_000
	for _, tc := range []struct {
		zone string
		want map[string]float64
	}{
		{"zone=a", map[string]float64{"a1": 1.0 / 8 * 5 / 8, "a2": 1.0 / 2 * 5 / 8, "a3": 1 - 5.0/8*5/8}},
		{"zone=b", map[string]float64{"b1": 0.75, "b2": 0.25}},
		{"zone=c", map[string]float64{"c1": 0.25, "c2": 0.75}},
	} {
		counts := map[string]int{}
		for range n {
			d, cluster := c.place([]string{tc.zone}, DefaultMaxUsed, 1, map[string]bool{})
			if cluster != "test" {
				t.Fatalf("cluster %q", cluster)
			}
			counts[d]++
		}
		t.Logf("%s: %v", tc.zone, counts)
		for d := range counts {
			if _, ok := tc.want[d]; !ok {
				t.Fatalf("%s: placements %v: some on %q", tc.zone, counts, d)
			}
		}
		for d, p := range tc.want {
			if share := float64(counts[d]) / n; math.Abs(share-p) > 0.02 {
				t.Fatalf("%s: placements %v: %s got %.4f of them; want %.4f", tc.zone, counts, d, share, p)
			}
		}
	}
}

// A device that answers that it has no room is passed over for another;
// with no device left that could hold the allocation, the error is
// ErrNoSpace. A quota refusal is returned as it is.
func TestClusterPlacementSkipsADeviceWithNoSpace(t *testing.T) {
	fc := newFakeCluster()
	m1, m2 := fc.member(t, "s1"), fc.member(t, "s2")
	fc.publish(topology(1, []*fakeMember{m1, m2},
		fakeDev("full", m1, 1, 2_000_000, 1_000_000, "zone=a"),
		fakeDev("ok", m2, 1, 2_000, 1_000, "zone=a"),
	))
	fc.setFree("full", 0) // published before it filled up
	c := dialCluster(t, []string{m1.addr}, Options{})
	ctx := ctxT(t)
	place := Placement{Labels: []string{"zone=a"}, MaxUsed: 1}
	for range 20 {
		p, err := c.Allocate(ctx, place, 1, 2)
		if err != nil || p.Device != "ok" {
			t.Fatalf("Allocate: %+v, %v; want a placement on ok", p, err)
		}
	}
	if got := m1.calls("Allocate"); len(got) != 1 {
		t.Fatalf("the full device was asked %d times; want once (then reckoned full)", len(got))
	}
	if got := c.estimate("full"); got != 0 {
		t.Fatalf("the full device is reckoned at %d free blocks", got)
	}

	// Nothing can hold it.
	_, err := c.Allocate(ctx, place, 1, 10_000)
	var ns *NoSpaceError
	if !errors.Is(err, ErrNoSpace) || !errors.As(err, &ns) || !strings.Contains(err.Error(), "no device of cluster") ||
		!strings.Contains(err.Error(), "10000 free blocks") {
		t.Fatalf("Allocate larger than every device: %v; want ErrNoSpace", err)
	}
	if _, err := c.Allocate(ctx, Placement{Labels: []string{"zone=c"}}, 1, 1); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Allocate with labels no device has: %v; want ErrNoSpace", err)
	}
	// ok fills up too: asked once, then no device is left.
	asked := len(m2.calls("Allocate"))
	fc.setFree("ok", 0)
	_, err = c.Allocate(ctx, place, 1, 2)
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "refused for want of space: ok") {
		t.Fatalf("Allocate with every device full: %v; want ErrNoSpace", err)
	}
	if got := len(m2.calls("Allocate")) - asked; got != 1 {
		t.Fatalf("ok asked %d times; want once", got)
	}

	// A quota refusal is not a full device: returned at once. (The same
	// published figures would leave both reckoned full.)
	fc.publish(topology(2, []*fakeMember{m1, m2},
		fakeDev("full", m1, 1, 2_000_000, 999_999, "zone=a"),
		fakeDev("ok", m2, 1, 2_000, 999, "zone=a"),
	))
	waitRevision(t, c, 2)
	quota := func(string, int) error {
		s, _ := status.New(codes.ResourceExhausted, "tenant t over its quota").WithDetails(&pb.QuotaDetails{Tenant: "t"})
		return s.Err()
	}
	m1.set(func() { m1.refuse = quota })
	m2.set(func() { m2.refuse = quota })
	_, err = c.Allocate(ctx, place, 1, 2)
	if !errors.Is(err, ErrQuota) || errors.Is(err, ErrNoSpace) {
		t.Fatalf("Allocate over quota: %v; want ErrQuota", err)
	}
	if got := len(m1.calls("Allocate")) + len(m2.calls("Allocate")) - asked - 2; got != 1 {
		t.Fatalf("%d devices asked after a quota refusal; want one", got)
	}
}

// The owner of a device fails a call (before running it, or after, its
// reply lost) and the device moves to another server with a higher epoch,
// which replays the device's request ids: the call is sent again, with
// the same request id, to the new owner, and its result is the first
// call's: the call ran once.
func TestClusterCallIsReroutedToTheNewOwner(t *testing.T) {
	cases := []struct {
		name   string
		method string
		ran    bool // the first sending ran before it failed
		err    error
	}{
		{name: "allocate unavailable", method: "Allocate", err: status.Error(codes.Unavailable, "stopping")},
		{name: "allocate reply lost", method: "Allocate", ran: true, err: status.Error(codes.Unavailable, "connection lost")},
		{name: "allocate deadline", method: "Allocate", ran: true, err: status.Error(codes.DeadlineExceeded, "too slow")},
		{name: "free reply lost", method: "Free", ran: true, err: status.Error(codes.Canceled, "cut off")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fc := newFakeCluster()
			m1, m2 := fc.member(t, "s1"), fc.member(t, "s2")
			both := []*fakeMember{m1, m2}
			fc.publish(topology(1, both, fakeDev("d", m1, 5, 1000, 1000)))
			c := dialCluster(t, []string{m1.addr}, Options{})
			ctx := ctxT(t)
			var before []Extent
			if tc.method == "Free" {
				var err error
				if before, err = c.AllocateOn(ctx, "d", 2, 3); err != nil {
					t.Fatal(err)
				}
			}
			fail := func(method string, n int) error {
				if method != tc.method || n != 1 {
					return nil
				}
				fc.publishLocked(topology(2, both, fakeDev("d", m2, 6, 1000, 1000)))
				return tc.err
			}
			m1.set(func() {
				if tc.ran {
					m1.lost = fail
				} else {
					m1.refuse = fail
				}
			})
			var got []Extent
			var freed uint64
			var err error
			if tc.method == "Free" {
				freed, err = c.Free(ctx, "d", before...)
			} else {
				got, err = c.AllocateOn(ctx, "d", 2, 4)
			}
			if err != nil {
				t.Fatalf("%s: %v", tc.method, err)
			}
			at1, at2 := m1.calls(tc.method), m2.calls(tc.method)
			if len(at1) == 0 || len(at2) != 1 {
				t.Fatalf("s1 received %+v, s2 %+v; want the call at both, once at s2", at1, at2)
			}
			id := at1[0].id
			for _, r := range append(at1, at2...) {
				if r.id != id || r.device != "d" {
					t.Fatalf("requests %+v, %+v: not all with one id on d", at1, at2)
				}
			}
			if at1[0].epoch != 5 || at2[0].epoch != 6 {
				t.Fatalf("epochs sent: %d to s1, %d to s2; want 5 and 6", at1[0].epoch, at2[0].epoch)
			}
			if n := fc.runs("d", tc.method); n != 1 {
				t.Fatalf("%s ran %d times on d; want once", tc.method, n)
			}
			free := fc.free("d")
			if tc.method == "Free" {
				if freed != 6 || free != 1000 {
					t.Fatalf("freed %d, the device has %d free; want 6 and 1000", freed, free)
				}
				return
			}
			first := fc.firstResult("d", id).(*pb.AllocateResponse)
			if len(got) != 2 || got[0].Start != first.Objects[0].Extents[0].Start ||
				got[1].Start != first.Objects[1].Extents[0].Start || free != 1000-8 {
				t.Fatalf("allocated %v, the first call %v, %d free; want the first call's result once", got, first, free)
			}
		})
	}
}

// A device without an owner (between owners: a server lists it, none owns
// it) has its calls wait until one takes it over; without retries they
// fail as unavailable.
func TestClusterCallWaitsForADeviceBetweenOwners(t *testing.T) {
	fc := newFakeCluster()
	m1 := fc.member(t, "s1")
	fc.publish(listing(topology(1, []*fakeMember{m1}), "s1", "late"))
	c := dialCluster(t, []string{m1.addr}, Options{})
	once := dialCluster(t, []string{m1.addr}, Options{})
	noRetry(once)
	if _, err := once.AllocateOn(ctxT(t), "late", 1, 1); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "no owner") {
		t.Fatalf("AllocateOn of a device without an owner, no retries: %v; want ErrUnavailable", err)
	}
	done := make(chan error, 1)
	ctx := ctxT(t)
	go func() {
		_, err := c.AllocateOn(ctx, "late", 1, 1)
		done <- err
	}()
	fc.publish(topology(2, []*fakeMember{m1}, fakeDev("late", m1, 1, 100, 100)))
	if err := <-done; err != nil {
		t.Fatalf("AllocateOn of a device taken over meanwhile: %v", err)
	}
}

// A device that no server of the topology lists, neither as a device it
// owns nor among those it can serve, is not the cluster's: a call on it
// fails at once with NOT_FOUND, naming the cluster and the device, and is
// not sent. A call waiting for an owner fails so too when no server lists
// the device any more.
func TestClusterDeviceNoServerListsIsNotFound(t *testing.T) {
	fc := newFakeCluster()
	m1 := fc.member(t, "s1")
	fc.publish(listing(topology(1, []*fakeMember{m1}, fakeDev("d", m1, 1, 1000, 1000)), "s1", "spare"))
	c := dialCluster(t, []string{m1.addr}, Options{RetryFor: time.Minute})
	ctx := ctxT(t)
	notFound := func(what string, err error) {
		t.Helper()
		var r *RefusedError
		if !errors.As(err, &r) || r.Code != codes.NotFound || errors.Is(err, ErrUnavailable) ||
			!strings.Contains(err.Error(), `cluster "test"`) || !strings.Contains(err.Error(), `"nowhere"`) {
			t.Fatalf("%s of a device no server lists: %v; want a NOT_FOUND *RefusedError naming cluster test and device nowhere", what, err)
		}
	}
	start := time.Now()
	_, err := c.AllocateOn(ctx, "nowhere", 1, 1)
	notFound("AllocateOn", err)
	_, err = c.Free(ctx, "nowhere", Extent{Start: 1, Len: 1})
	notFound("Free", err)
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("the calls took %v; want them failed at once, not after RetryFor", took)
	}
	if got := append(m1.calls("Allocate"), m1.calls("Free")...); len(got) != 0 {
		t.Fatalf("the server received %+v; want nothing", got)
	}
	// Without retries too.
	once := dialCluster(t, []string{m1.addr}, Options{RetryFor: NoRetry})
	_, err = once.AllocateOn(ctx, "nowhere", 1, 1)
	notFound("AllocateOn without retries", err)

	// spare is listed, without an owner: its call waits, until no server
	// lists it.
	done := make(chan error, 1)
	go func() {
		_, err := c.AllocateOn(ctx, "spare", 1, 1)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // most likely waiting by now; the outcome is the same either way
	fc.publish(topology(2, []*fakeMember{m1}, fakeDev("d", m1, 1, 1000, 1000)))
	err = <-done
	var r *RefusedError
	if !errors.As(err, &r) || r.Code != codes.NotFound || !strings.Contains(err.Error(), `"spare"`) {
		t.Fatalf("AllocateOn of a device no server lists any more: %v; want NOT_FOUND", err)
	}
	if got := m1.calls("Allocate"); len(got) != 0 {
		t.Fatalf("the server received %+v; want nothing", got)
	}
}

// The estimate of a device's free blocks is the published figure, replaced
// by the free blocks of every Allocate or Free reply from the device
// (whatever other clients did meanwhile; replayed replies too), 0 after
// it answered that it has no room; a topology that shows a different
// (free_blocks, epoch) for it sets it to the published figure again, one
// that shows the same does not.
func TestClusterEstimateIsTheDevicesLastReply(t *testing.T) {
	fc := newFakeCluster()
	m1 := fc.member(t, "s1")
	fc.publish(topology(1, []*fakeMember{m1}, fakeDev("d", m1, 1, 1000, 1000)))
	c := dialCluster(t, []string{m1.addr}, Options{})
	ctx := ctxT(t)
	if got := c.estimate("d"); got != 1000 {
		t.Fatalf("reckoned %d free blocks; want the published 1000", got)
	}
	fc.setFree("d", 600) // other clients allocated 400 blocks
	es, err := c.AllocateOn(ctx, "d", 1, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.estimate("d"); got != 590 {
		t.Fatalf("reckoned %d free blocks after an Allocate that left 590; want 590", got)
	}
	fc.setFree("d", 900) // other clients freed 300
	if _, err := c.Free(ctx, "d", es...); err != nil {
		t.Fatal(err)
	}
	if got := c.estimate("d"); got != 910 {
		t.Fatalf("reckoned %d free blocks after a Free that left 910; want 910", got)
	}

	// The first reply is lost; meanwhile others allocate 100 blocks; the
	// resent call's replayed reply says what is free then.
	m1.set(func() {
		m1.lost = func(method string, n int) error {
			if method != "Allocate" || n != 2 {
				return nil
			}
			fc.devices["d"].free -= 100
			return status.Error(codes.Unavailable, "connection lost")
		}
	})
	if _, err := c.AllocateOn(ctx, "d", 1, 5); err != nil {
		t.Fatal(err)
	}
	calls := m1.calls("Allocate")
	if len(calls) != 3 || calls[1].id != calls[2].id || fc.runs("d", "Allocate") != 2 {
		t.Fatalf("requests %+v, %d runs; want the last two with one id, run once", calls, fc.runs("d", "Allocate"))
	}
	if got, want := c.estimate("d"), uint64(910-5-100); got != want || fc.free("d") != want {
		t.Fatalf("reckoned %d free blocks after a replayed reply, the device has %d; want %d", got, fc.free("d"), want)
	}

	// No room: reckoned 0, and no device is left.
	fc.setFree("d", 3)
	if _, err := c.Allocate(ctx, Placement{}, 1, 10); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Allocate on a full device: %v; want ErrNoSpace", err)
	}
	if got := c.estimate("d"); got != 0 {
		t.Fatalf("reckoned %d free blocks after a no-space answer; want 0", got)
	}

	// The same published figure and epoch in a new topology: kept.
	fc.publish(topology(2, []*fakeMember{m1}, fakeDev("d", m1, 1, 1000, 1000, "new=label")))
	waitRevision(t, c, 2)
	if got := c.estimate("d"); got != 0 {
		t.Fatalf("reckoned %d free blocks after a topology with the same figure and epoch; want 0 still", got)
	}
	// The same figure at another epoch: taken.
	fc.publish(topology(3, []*fakeMember{m1}, fakeDev("d", m1, 2, 1000, 1000)))
	waitRevision(t, c, 3)
	if got := c.estimate("d"); got != 1000 {
		t.Fatalf("reckoned %d free blocks after a publication at a new epoch; want 1000", got)
	}
	// Another figure: taken.
	fc.publish(topology(4, []*fakeMember{m1}, fakeDev("d", m1, 2, 1000, 777)))
	waitRevision(t, c, 4)
	if got := c.estimate("d"); got != 777 {
		t.Fatalf("reckoned %d free blocks after a publication of 777; want 777", got)
	}
}

// With retries off (NoRetry) each call is sent once; it carries a request
// id all the same, new for each call, as the plain Client's calls do.
func TestClusterNoRetryRequestIDs(t *testing.T) {
	fc := newFakeCluster()
	m1 := fc.member(t, "s1")
	fc.publish(topology(1, []*fakeMember{m1}, fakeDev("d", m1, 1, 1000, 1000)))
	c := dialCluster(t, []string{m1.addr}, Options{RetryFor: NoRetry})
	ctx := ctxT(t)
	m1.set(func() {
		m1.refuse = func(method string, n int) error {
			if n == 1 {
				return status.Error(codes.Unavailable, "stopping")
			}
			return nil
		}
	})
	if _, err := c.AllocateOn(ctx, "d", 1, 1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("AllocateOn refused as unavailable, no retries: %v; want ErrUnavailable", err)
	}
	if got := m1.calls("Allocate"); len(got) != 1 {
		t.Fatalf("sent %d times; want once", len(got))
	}
	es, err := c.AllocateOn(ctx, "d", 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Free(ctx, "d", es...); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Free refused as unavailable, no retries: %v; want ErrUnavailable", err)
	}
	if _, err := c.Free(ctx, "d", es...); err != nil {
		t.Fatal(err)
	}
	received := append(m1.calls("Allocate"), m1.calls("Free")...)
	if len(received) != 4 {
		t.Fatalf("requests %+v; want 4, each sent once", received)
	}

	// The plain Client, also without retries, on the same device.
	cl, err := Dial(m1.addr, Options{Device: "d", RetryFor: NoRetry})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Allocate(ctx, 1); err != nil {
		t.Fatal(err)
	}
	plain := m1.calls("Allocate")
	plainID := plain[len(plain)-1].id
	if plainID == 0 {
		t.Fatalf("the plain Client's request %+v; want a request id", plain[len(plain)-1])
	}
	seen := map[uint64]bool{plainID: true}
	for _, r := range received {
		if r.id == 0 || seen[r.id] {
			t.Fatalf("requests %+v: an id 0 or used twice; want a new id for each call, as the plain Client's", received)
		}
		seen[r.id] = true
	}
}

// A reply with an older epoch than one known for the device comes from a
// stale owner: its result is not used, the call is sent again (the same
// id). The epoch known is the topology's or a newer reply's.
func TestClusterStaleEpochReplyIsNotAccepted(t *testing.T) {
	fc := newFakeCluster()
	m1 := fc.member(t, "s1")
	fc.publish(topology(1, []*fakeMember{m1}, fakeDev("d", m1, 5, 1000, 1000)))
	c := dialCluster(t, []string{m1.addr}, Options{})
	ctx := ctxT(t)
	m1.set(func() {
		m1.stale = func(method string, n int) uint64 {
			if n == 1 {
				return 4 // older than the topology's 5
			}
			return 0
		}
	})
	got, err := c.AllocateOn(ctx, "d", 1, 7)
	if err != nil {
		t.Fatal(err)
	}
	calls := m1.calls("Allocate")
	if len(calls) != 2 || calls[0].id != calls[1].id || calls[0].epoch != 5 || calls[1].epoch != 5 {
		t.Fatalf("requests %+v; want two with one id, at epoch 5", calls)
	}
	first := fc.firstResult("d", calls[0].id).(*pb.AllocateResponse)
	if fc.runs("d", "Allocate") != 1 || got[0].Start != first.Objects[0].Extents[0].Start {
		t.Fatalf("allocated %v, first %v, %d runs", got, first, fc.runs("d", "Allocate"))
	}

	// A reply shows a newer epoch than the topology: requests carry it,
	// and a reply older than it is stale.
	m1.set(func() {
		m1.owns["d"] = 9
		m1.stale = nil
	})
	if _, err := c.AllocateOn(ctx, "d", 1, 1); err != nil {
		t.Fatal(err)
	}
	m1.set(func() {
		m1.stale = func(method string, n int) uint64 {
			if n == 4 {
				return 7
			}
			return 0
		}
	})
	if _, err := c.AllocateOn(ctx, "d", 1, 1); err != nil {
		t.Fatal(err)
	}
	calls = m1.calls("Allocate")
	if len(calls) != 5 || calls[3].epoch != 9 || calls[4].epoch != 9 || calls[3].id != calls[4].id || calls[2].id == calls[3].id {
		t.Fatalf("requests %+v; want the last two with one id at epoch 9", calls)
	}
	// Without retries the stale reply is an error.
	once := dialCluster(t, []string{m1.addr}, Options{})
	noRetry(once)
	if _, err := once.AllocateOn(ctx, "d", 1, 1); err != nil {
		t.Fatal(err)
	}
	m1.set(func() { m1.stale = func(string, int) uint64 { return 8 } })
	if _, err := once.AllocateOn(ctx, "d", 1, 1); !errors.Is(err, ErrFenced) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a stale reply without retries: %v; want ErrFenced", err)
	}
}

// Request ids: one per call, never 0, different for each call.
func TestClusterRequestIDs(t *testing.T) {
	fc := newFakeCluster()
	m1 := fc.member(t, "s1")
	fc.publish(topology(1, []*fakeMember{m1}, fakeDev("d", m1, 1, 1000, 1000)))
	c := dialCluster(t, []string{m1.addr}, Options{})
	c.lastRequest.Store(^uint64(0) - 1)
	ctx := ctxT(t)
	for range 3 {
		es, err := c.AllocateOn(ctx, "d", 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Free(ctx, "d", es...); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[uint64]bool{}
	received := append(m1.calls("Allocate"), m1.calls("Free")...)
	for _, r := range received {
		if r.id == 0 || seen[r.id] {
			t.Fatalf("requests %+v: an id 0 or used twice", received)
		}
		seen[r.id] = true
	}
	if c.estimate("d") != 1000 {
		t.Fatalf("reckoned %d free blocks after freeing what was allocated", c.estimate("d"))
	}
}

// Closing ends the watcher and the connections; calls fail as closed.
func TestClusterClose(t *testing.T) {
	fc := newFakeCluster()
	m1 := fc.member(t, "s1")
	fc.publish(topology(1, []*fakeMember{m1}, fakeDev("d", m1, 1, 1000, 1000)))
	c := dialCluster(t, []string{m1.addr}, Options{})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AllocateOn(ctxT(t), "d", 1, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("AllocateOn after Close: %v; want ErrClosed", err)
	}
	_ = c.Close()
}

// Allocation across a cluster: placed by free space in zone a, freed on
// the device that holds it.
func ExampleCluster() {
	ctx := context.Background()
	c, err := DialCluster(ctx, []string{"10.0.0.1:7878", "10.0.0.2:7878"}, Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	p, err := c.Allocate(ctx, Placement{Labels: []string{"zone=a"}}, 4, 256)
	if errors.Is(err, ErrNoSpace) {
		log.Fatal("no device in zone a has 1024 free blocks")
	} else if err != nil {
		log.Fatal(err)
	}
	fmt.Println(p.Device, p.Epoch, p.Extents)
	if _, err := c.Free(ctx, p.Device, p.Extents...); err != nil {
		log.Fatal(err)
	}
	for _, d := range c.Topology().GetDevices() {
		fmt.Println(d.GetName(), "on", d.GetServer(), d.GetFreeBlocks(), "free")
	}
}
