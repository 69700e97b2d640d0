package blockalloc

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// ClusterLeasing against real `blockalloc serve` processes in a cluster on
// a real etcd (see cluster_server_test.go).

// A ClusterLeasing allocates, commits and frees on a device while its
// owner is killed (SIGKILL) and a standby takes the device over: its
// Leasing follows the device to the standby, whose commits succeed; no
// call fails meanwhile (it waits for the next owner); what a Commit
// reports lost is dropped, and every allocation committed and not freed
// is allocated on the standby, once, without overlap.
func TestClusterLeasingFollowsTheOwnerThroughAFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, s0, s1, before := ownerAndStandby(ctx, t)
	defer c.Close()
	d0 := topoDevice(before, "d0")

	// A plain client of d0 that follows its owner too.
	dc, err := c.DeviceClient("d0")
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	if st, err := dc.Status(ctx); err != nil || st.GetEpoch() != d0.GetEpoch() {
		t.Fatalf("status of d0 through its device client: %v, %v; want epoch %d", st, err, d0.GetEpoch())
	}

	cl := NewClusterLeasing(c, Placement{}, LeaseOptions{})
	rng := rand.New(rand.NewPCG(7, 11))
	var (
		pending   []Extent // allocated, not yet committed
		committed []Extent // committed, not freed
		commits   int      // Commits that succeeded
		after     int      // of them, once s1 served d0
		lost      int      // allocations reported lost
		killed    bool
		served    bool
	)
	// commit commits until every allocation pending is durable or lost.
	commit := func() {
		for {
			err := cl.Commit(ctx)
			if err == nil {
				break
			}
			var le *LostError
			if errors.As(err, &le) {
				lost += len(le.Extents)
				pending = slices.DeleteFunc(pending, func(e Extent) bool { return slices.Contains(le.Extents, e) })
				if err == error(le) {
					break
				}
			}
			t.Fatalf("commit %d (killed: %v): %v", commits+1, killed, err)
		}
		committed = append(committed, pending...)
		pending = nil
		commits++
		if served {
			after++
		}
	}
	deadline := time.Now().Add(clusterWait)
	for i := 0; after < 20; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d commits, %d once s1 served (killed: %v, served: %v)", clusterWait, commits,
				after, killed, served)
		}
		n := 1 + rng.Uint64N(8)
		device, e, err := cl.Allocate(ctx, n)
		if err != nil {
			t.Fatalf("allocation %d (killed: %v): %v", i, killed, err)
		}
		if device != "d0" || e.Len != n || e.End() > d0.GetCapacityBlocks() {
			t.Fatalf("allocation %d of %d blocks: %s on %q", i, n, e, device)
		}
		pending = append(pending, e)
		time.Sleep(2 * time.Millisecond)
		if len(pending) < 16 {
			continue
		}
		commit()
		// Frees of committed allocations: a few each time, and the oldest
		// beyond 200 held, so that the device never fills.
		for k := 0; len(committed) > 0 && (k < 4 || len(committed) > 200); k++ {
			j := rng.IntN(len(committed))
			if err := cl.Free("d0", committed[j]); err != nil {
				t.Fatalf("free of %s: %v", committed[j], err)
			}
			committed = slices.Delete(committed, j, j+1)
		}
		topo := c.Topology()
		if !killed && commits >= 3 && slices.ContainsFunc(topo.GetServers(),
			func(s *pb.ClusterServer) bool { return s.GetName() == "s1" }) {
			s0.kill()
			killed = true
			t.Logf("s0 killed after %d commits", commits)
		}
		if killed && !served && topoDevice(topo, "d0").GetServer() == "s1" {
			served = true
			t.Logf("s1 serves d0 after %d commits", commits)
		}
	}
	commit()
	if err := cl.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, _, err := cl.Allocate(ctx, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("allocation after Close: %v, want ErrClosed", err)
	}
	t.Logf("%d commits, %d after the failover, %d allocations lost, %d held", commits,
		after, lost, len(committed))

	d1 := topoDevice(c.Topology(), "d0")
	if d1.GetServer() != "s1" || d1.GetAddress() != s1.waitListening(t) || d1.GetEpoch() <= d0.GetEpoch() {
		t.Fatalf("d0 after the failover: %v; before: %v; want it on s1 with a higher epoch", d1, d0)
	}
	// The device client moved to s1 as well (a call may meet the
	// connection still on its way there).
	var st *DeviceStatus
	eventually(t, clusterWait, "a status of d0 from s1 through the device client", func() bool {
		st, err = dc.Status(ctx)
		return err == nil
	})
	if st.GetEpoch() != d1.GetEpoch() {
		t.Fatalf("status of d0 through its device client after the failover: epoch %d, want %d", st.GetEpoch(),
			d1.GetEpoch())
	}
	disjoint(t, committed)
	freeOnceEach(t, ctx, c, "d0", committed)
}

// One server with two devices: a ClusterLeasing fills one device, moves to
// the other, and answers ErrNoSpace only once both are full; everything
// it allocated frees once. Devices that no server lists are refused.
func TestClusterLeasingMovesToAnotherDeviceWhenOneFills(t *testing.T) {
	dir := t.TempDir()
	etcd := startEtcd(t)
	s0 := startClusterServer(t, dir, etcd, "s0",
		"--device", filepath.Join(dir, "d0"), "--device", filepath.Join(dir, "d1"))
	addr := s0.waitListening(t)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := DialCluster(ctx, []string{addr}, Options{RetryFor: clusterWait})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	topo := waitTopology(t, c, "d0 and d1 with their space known", func(topo *pb.Topology) bool {
		return len(topo.GetDevices()) == 2 && !slices.ContainsFunc(topo.GetDevices(),
			func(d *pb.ClusterDevice) bool { return !d.GetSpaceKnown() })
	})

	if _, err := c.DeviceClient("nope"); refusedCode(err) != codes.NotFound {
		t.Fatalf("DeviceClient of an unknown device: %v, want a refusal with NOT_FOUND", err)
	}
	if _, err := c.Leasing("nope", LeaseOptions{}); refusedCode(err) != codes.NotFound {
		t.Fatalf("Leasing of an unknown device: %v, want a refusal with NOT_FOUND", err)
	}

	cl := NewClusterLeasing(c, Placement{}, LeaseOptions{})
	if err := cl.Free("d0", Extent{Start: 100, Len: 1}); refusedCode(err) != codes.InvalidArgument {
		t.Fatalf("free on a device never used: %v, want a refusal with INVALID_ARGUMENT", err)
	}
	const n = 64
	got := map[string][]Extent{}
	var order []string
	for i := 0; ; i++ {
		device, e, err := cl.Allocate(ctx, n)
		if err != nil {
			var ns *NoSpaceError
			if !errors.As(err, &ns) {
				t.Fatalf("allocation %d: %v, want a *NoSpaceError at the end", i, err)
			}
			t.Logf("after %d allocations: %v", i, err)
			break
		}
		d := topoDevice(topo, device)
		if d == nil || e.Len != n || e.End() > d.GetCapacityBlocks() {
			t.Fatalf("allocation %d: %s on %q", i, e, device)
		}
		if !slices.Contains(order, device) {
			order = append(order, device)
		}
		got[device] = append(got[device], e)
		if i%64 == 63 {
			if err := cl.Commit(ctx); err != nil {
				t.Fatalf("commit after allocation %d: %v", i, err)
			}
		}
		if i > 1<<16 {
			t.Fatalf("%d allocations of %d blocks and no ErrNoSpace", i, n)
		}
	}
	if err := cl.Commit(ctx); err != nil {
		t.Fatalf("last commit: %v", err)
	}
	if len(order) != 2 {
		t.Fatalf("devices used: %v, want both", order)
	}
	t.Logf("devices in order of use: %v; objects: d0 %d, d1 %d", order, len(got["d0"]), len(got["d1"]))
	for _, name := range order {
		pc, err := Dial(addr, Options{Device: name})
		if err != nil {
			t.Fatal(err)
		}
		st, err := pc.Status(ctx)
		_ = pc.Close()
		if err != nil {
			t.Fatalf("status of %s: %v", name, err)
		}
		t.Logf("%s: %d of %d blocks free, largest free extent %d, %d leases", name, st.GetFreeBlocks(),
			st.GetCapacityBlocks(), st.GetLargestFreeExtent(), st.GetLeases())
		if st.GetLargestFreeExtent() >= n || st.GetFreeBlocks() > st.GetCapacityBlocks()/20 {
			t.Fatalf("%s is not full at the ErrNoSpace: %v", name, st)
		}
	}
	if err := cl.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	for _, name := range order {
		disjoint(t, got[name])
		freeOnceEach(t, ctx, c, name, got[name])
		holdsNothing(t, ctx, addr, name)
	}
}
