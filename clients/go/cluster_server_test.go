package blockalloc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// The Cluster against real `blockalloc serve` processes in a cluster on a
// real etcd (one member on loopback ports), as crates/cli/tests/cluster.rs
// runs them. Nothing here is skipped: with no etcd to run, the tests fail
// saying how to get one.

// clusterWait bounds every wait for a condition in these tests: generous,
// for a loaded machine; a passing run waits far less.
const clusterWait = 2 * time.Minute

// workspaceTarget is Cargo's target directory: $CARGO_TARGET_DIR (relative
// to the workspace root when relative, as ci.sh takes it), else the
// workspace's target/.
func workspaceTarget(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	target := os.Getenv("CARGO_TARGET_DIR")
	switch {
	case target == "":
		target = filepath.Join(root, "target")
	case !filepath.IsAbs(target):
		target = filepath.Join(root, target)
	}
	return target
}

// etcdBinary is the etcd to run, found as the Rust tests find it
// (crates/cluster/src/testkit.rs): $BLOCKALLOC_ETCD; else etcd/etcd in
// Cargo's target directory; else built there from the pinned module in
// tools/etcd (`go build`, under the lock file that the Rust tests take
// too); else etcd on PATH. With none it fails the test saying so.
func etcdBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("BLOCKALLOC_ETCD"); p != "" {
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			t.Fatalf("BLOCKALLOC_ETCD=%s is not an etcd binary: %v", p, err)
		}
		return p
	}
	dir := filepath.Join(workspaceTarget(t), "etcd")
	built := filepath.Join(dir, "etcd")
	if isFile(built) {
		return built
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("no etcd for the cluster tests: cannot create %s: %v", dir, err)
	}
	// Test processes (Go and Rust) run in parallel: one builds.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("no etcd for the cluster tests: cannot create the build lock: %v", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("no etcd for the cluster tests: cannot lock %s: %v", lock.Name(), err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if isFile(built) {
		return built
	}
	tools, err := filepath.Abs(filepath.Join("..", "..", "tools", "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "etcd.partial")
	var why string
	if goBin, err := exec.LookPath("go"); err != nil {
		why = "go is not installed"
	} else {
		cmd := exec.Command(goBin, "build", "-o", tmp, "go.etcd.io/etcd/server/v3")
		cmd.Dir = tools
		out, err := cmd.CombinedOutput()
		if err == nil {
			if err := os.Rename(tmp, built); err != nil {
				t.Fatalf("cannot move the etcd binary into place: %v", err)
			}
			return built
		}
		why = fmt.Sprintf("`go build` in %s: %v: %s", tools, err, out)
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	t.Fatalf("no etcd for the cluster tests: set BLOCKALLOC_ETCD, install Go (to build the pinned "+
		"etcd from tools/etcd into %s), or put etcd on PATH (%s)", built, why)
	return ""
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// freePort is a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// child is a process a test started, killed (SIGKILL) at the end of the
// test at the latest.
type child struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
	once sync.Once
}

// spawn starts cmd with its stderr in the file log and registers its kill
// with t.Cleanup.
func spawn(t testing.TB, cmd *exec.Cmd, log string) *child {
	t.Helper()
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stderr = f
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start %s: %v", cmd.Path, err)
	}
	p := &child{cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

// kill ends the process with SIGKILL and waits until it has exited.
func (p *child) kill() {
	p.once.Do(func() { _ = p.cmd.Process.Kill() })
	<-p.done
}

func (p *child) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// logText is the end of the process's log, for a failure message.
func (p *child) logText() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// startEtcd starts a one-member etcd on loopback ports and returns its
// client endpoint (127.0.0.1:PORT) once it answers /health.
func startEtcd(t testing.TB) string {
	t.Helper()
	bin := etcdBinary(t)
	var last *child
	for try := 0; try < 5; try++ {
		dir := t.TempDir()
		client, peer, metrics := freePort(t), freePort(t), freePort(t)
		c := fmt.Sprintf("http://127.0.0.1:%d", client)
		p := fmt.Sprintf("http://127.0.0.1:%d", peer)
		health := fmt.Sprintf("http://127.0.0.1:%d/health", metrics)
		cmd := exec.Command(bin,
			"--name", "default", "--data-dir", filepath.Join(dir, "data"),
			"--listen-client-urls", c, "--advertise-client-urls", c,
			"--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
			"--initial-cluster", "default="+p,
			"--election-timeout", "100", "--heartbeat-interval", "10",
			"--listen-metrics-urls", fmt.Sprintf("http://127.0.0.1:%d", metrics),
			"--log-level", "error")
		last = spawn(t, cmd, filepath.Join(dir, "etcd.log"))
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) && !last.exited() {
			if etcdHealthy(health) {
				return fmt.Sprintf("127.0.0.1:%d", client)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// A port taken between choosing and binding: other ports.
		last.kill()
	}
	t.Fatalf("etcd (%s) did not come up: %s", bin, last.logText())
	return ""
}

func etcdHealthy(url string) bool {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	r, err := hc.Get(url)
	if err != nil {
		return false
	}
	defer r.Body.Close()
	body, err := io.ReadAll(r.Body)
	return err == nil && strings.Contains(string(body), `"health":"true"`)
}

// clusterServer is a `blockalloc serve` process in cluster "c".
type clusterServer struct {
	*child
	name string
	// listening gets the address of its `listening on ADDR` line, and is
	// closed when its stdout ends.
	listening chan string
	addr      string
}

// startClusterServer starts server name of cluster "c" on etcd with a
// lease TTL of 2 s, its devices formatted at 64 MiB when new, its log in
// dir, and args (--device PATH..., --label, --standby) added. It does not
// wait for it to listen (a standby listens only once it took its
// devices): see waitListening.
func startClusterServer(t testing.TB, dir, etcd, name string, args ...string) *clusterServer {
	t.Helper()
	all := append([]string{"serve"}, args...)
	all = append(all, "--format", "64MiB", "--listen", "127.0.0.1:0",
		"--etcd", etcd, "--cluster", "c", "--server-name", name, "--etcd-ttl", "2")
	cmd := exec.Command(serverBin(t), all...)
	// A pipe of its own rather than StdoutPipe, which Wait closes: it is
	// read to its end however the process ends.
	stdout, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	s := &clusterServer{name: name, listening: make(chan string, 1)}
	s.child = spawn(t, cmd, filepath.Join(dir, name+".log"))
	_ = w.Close()
	go func() {
		defer close(s.listening)
		defer stdout.Close()
		sc := bufio.NewScanner(stdout)
		sent := false
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening on "); ok && !sent {
				s.listening <- a
				sent = true
			}
		}
	}()
	return s
}

// waitListening waits for the server's `listening on` line and returns
// its address.
func (s *clusterServer) waitListening(t testing.TB) string {
	t.Helper()
	if s.addr != "" {
		return s.addr
	}
	select {
	case a, ok := <-s.listening:
		if !ok {
			s.kill()
			t.Fatalf("server %s exited before listening: %s", s.name, s.logText())
		}
		s.addr = a
	case <-time.After(clusterWait):
		t.Fatalf("server %s did not print its address in %v: %s", s.name, clusterWait, s.logText())
	}
	return s.addr
}

// waitTopology waits until the Cluster's topology satisfies cond, and
// returns it.
func waitTopology(t testing.TB, c *Cluster, what string, cond func(*pb.Topology) bool) *pb.Topology {
	t.Helper()
	timeout := time.NewTimer(clusterWait)
	defer timeout.Stop()
	for {
		topo, changed := c.Watch()
		if cond(topo) {
			return topo
		}
		select {
		case <-changed:
		case <-timeout.C:
			t.Fatalf("after %v: %s; the topology: %v", clusterWait, what, topo)
		}
	}
}

func topoDevice(topo *pb.Topology, name string) *pb.ClusterDevice {
	for _, d := range topo.GetDevices() {
		if d.GetName() == name {
			return d
		}
	}
	return nil
}

// freeOnceEach frees each extent of device through the cluster, then
// checks that freeing it again is refused (FAILED_PRECONDITION: the space
// is not allocated).
func freeOnceEach(t *testing.T, ctx context.Context, c *Cluster, device string, es []Extent) {
	t.Helper()
	for _, e := range es {
		n, err := c.Free(ctx, device, e)
		if err != nil {
			t.Fatalf("free of %s on %s: %v", e, device, err)
		}
		if n != e.Len {
			t.Fatalf("free of %s on %s freed %d blocks", e, device, n)
		}
	}
	for _, e := range es {
		if _, err := c.Free(ctx, device, e); refusedCode(err) != codes.FailedPrecondition {
			t.Fatalf("second free of %s on %s: %v, want a refusal with FAILED_PRECONDITION", e, device, err)
		}
	}
}

// holdsNothing checks, on the device's owner, that the device has nothing
// allocated but its metadata.
func holdsNothing(t *testing.T, ctx context.Context, addr, device string) {
	t.Helper()
	cl, err := Dial(addr, Options{Device: device})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	st, err := cl.Status(ctx)
	if err != nil {
		t.Fatalf("status of %s at %s: %v", device, addr, err)
	}
	if st.GetUsedBlocks() != st.GetMetaBlocks() {
		t.Fatalf("device %s: %d blocks used, %d of them metadata: allocations left behind", device,
			st.GetUsedBlocks(), st.GetMetaBlocks())
	}
}

// Two servers of two devices each, in zones a and b, reached through a
// seed list whose first address is dead: allocations restricted to a
// zone land on its devices, a zone without devices has no space, and
// allocations anywhere land on the cluster's devices, within them,
// without overlap, and free once each.
func TestClusterServersPlacementAndLabels(t *testing.T) {
	dir := t.TempDir()
	etcd := startEtcd(t)
	dev := func(name string) string { return filepath.Join(dir, name) }
	s0 := startClusterServer(t, dir, etcd, "s0", "--device", dev("d0"), "--device", dev("d1"), "--label", "zone=a")
	s1 := startClusterServer(t, dir, etcd, "s1", "--device", dev("d2"), "--device", dev("d3"), "--label", "zone=b")
	s0.waitListening(t)
	s1.waitListening(t)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := DialCluster(ctx, []string{deadAddr(t), s1.addr}, Options{RetryFor: clusterWait})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	topo := waitTopology(t, c, "4 devices with their space known", func(topo *pb.Topology) bool {
		return len(topo.GetDevices()) == 4 && !slices.ContainsFunc(topo.GetDevices(),
			func(d *pb.ClusterDevice) bool { return !d.GetSpaceKnown() })
	})
	zone := map[string]string{"d0": "a", "d1": "a", "d2": "b", "d3": "b"}
	owner := map[string]*clusterServer{"d0": s0, "d1": s0, "d2": s1, "d3": s1}
	for name, z := range zone {
		d := topoDevice(topo, name)
		if d == nil {
			t.Fatalf("no device %s in the topology %v", name, topo)
		}
		s := owner[name]
		if d.GetServer() != s.name || d.GetAddress() != s.addr || d.GetEpoch() == 0 || d.GetCapacityBlocks() == 0 {
			t.Fatalf("device %s: %v; want it owned by %s at %s, with an epoch and a capacity", name, d, s.name, s.addr)
		}
		if !slices.Contains(d.GetLabels(), "zone="+z) || !slices.Contains(d.GetLabels(), "server="+s.name) {
			t.Fatalf("device %s has labels %v; want zone=%s and server=%s", name, d.GetLabels(), z, s.name)
		}
	}

	// Restricted to a zone: on its devices only.
	for i := range 40 {
		z := []string{"a", "b"}[i%2]
		blocks := uint64(1 + i)
		p, err := c.Allocate(ctx, Placement{Labels: []string{"zone=" + z}}, 1, blocks)
		if err != nil {
			t.Fatalf("allocation %d in zone %s: %v", i, z, err)
		}
		if zone[p.Device] != z || len(p.Extents) != 1 || p.Extents[0].Len != blocks {
			t.Fatalf("allocation %d in zone %s of %d blocks: %+v", i, z, blocks, p)
		}
		if n, err := c.Free(ctx, p.Device, p.Extents...); err != nil || n != blocks {
			t.Fatalf("free of %+v: %d blocks, %v", p, n, err)
		}
	}
	_, err = c.Allocate(ctx, Placement{Labels: []string{"zone=z"}}, 1, 1)
	var ns *NoSpaceError
	if !errors.As(err, &ns) {
		t.Fatalf("allocation in a zone without devices: %v, want a *NoSpaceError", err)
	}

	// Anywhere: 200 objects of 64 blocks, 4 per call.
	placed := map[string][]Extent{}
	for i := range 50 {
		p, err := c.Allocate(ctx, Placement{}, 4, 64)
		if err != nil {
			t.Fatalf("allocation %d anywhere: %v", i, err)
		}
		d := topoDevice(topo, p.Device)
		if d == nil || len(p.Extents) != 4 {
			t.Fatalf("allocation %d anywhere: %+v", i, p)
		}
		if p.Epoch != d.GetEpoch() {
			t.Fatalf("allocation %d on %s has epoch %d; the device's owner has held it since epoch %d",
				i, p.Device, p.Epoch, d.GetEpoch())
		}
		for _, e := range p.Extents {
			if e.Len != 64 || e.End() > d.GetCapacityBlocks() {
				t.Fatalf("allocation %d: extent %s on %s of %d blocks", i, e, p.Device, d.GetCapacityBlocks())
			}
		}
		placed[p.Device] = append(placed[p.Device], p.Extents...)
	}
	for _, name := range []string{"d0", "d1", "d2", "d3"} {
		t.Logf("%s: %d objects", name, len(placed[name]))
		disjoint(t, placed[name])
		freeOnceEach(t, ctx, c, name, placed[name])
		holdsNothing(t, ctx, owner[name].addr, name)
	}
}

// ownerAndStandby starts etcd, server s0 owning device d0 and, once a
// Cluster dialled through s0 sees d0's space, server s1 standing by for
// d0. It returns the Cluster (close it), both servers and the topology
// before s1 started.
func ownerAndStandby(ctx context.Context, t *testing.T) (*Cluster, *clusterServer, *clusterServer, *pb.Topology) {
	t.Helper()
	dir := t.TempDir()
	etcd := startEtcd(t)
	dev := filepath.Join(dir, "d0")
	s0 := startClusterServer(t, dir, etcd, "s0", "--device", dev)
	s0.waitListening(t)
	c, err := DialCluster(ctx, []string{s0.addr}, Options{RetryFor: clusterWait})
	if err != nil {
		t.Fatal(err)
	}
	before := waitTopology(t, c, "d0 owned by s0, its space known", func(topo *pb.Topology) bool {
		d := topoDevice(topo, "d0")
		return d.GetServer() == "s0" && d.GetSpaceKnown()
	})
	s1 := startClusterServer(t, dir, etcd, "s1", "--device", dev, "--standby")
	return c, s0, s1, before
}

// A client keeps allocating and freeing on a device while its owner is
// killed (SIGKILL) and a standby takes the device over: every call
// succeeds, routed to the standby once it serves, the device's epoch
// grows, and everything the client holds is allocated on the standby,
// once.
func TestClusterFailoverRoutesToTheStandby(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, s0, s1, before := ownerAndStandby(ctx, t)
	defer c.Close()
	d0 := topoDevice(before, "d0")
	waitTopology(t, c, "the standby s1 among the servers", func(topo *pb.Topology) bool {
		return slices.ContainsFunc(topo.GetServers(), func(s *pb.ClusterServer) bool { return s.GetName() == "s1" })
	})

	var (
		mu   sync.Mutex
		held []Extent
		ok   int // calls that succeeded
		fail error
	)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			es, err := c.AllocateOn(ctx, "d0", 1, 8)
			if err != nil {
				mu.Lock()
				fail = fmt.Errorf("allocation %d: %w", i, err)
				mu.Unlock()
				return
			}
			mu.Lock()
			held = append(held, es...)
			ok++
			var e Extent
			free := i%3 == 2
			if free {
				// The oldest held: perhaps allocated by the other owner.
				e, held = held[0], held[1:]
			}
			mu.Unlock()
			if free {
				if n, err := c.Free(ctx, "d0", e); err != nil || n != e.Len {
					mu.Lock()
					fail = fmt.Errorf("free of %s after allocation %d: %d blocks, %w", e, i, n, err)
					mu.Unlock()
					return
				}
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}
	}()
	calls := func() (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return ok, fail
	}
	// waitCalls waits until n calls succeeded (or one failed).
	waitCalls := func(n int, what string) {
		eventually(t, clusterWait, what, func() bool {
			got, err := calls()
			return got >= n || err != nil
		})
	}
	waitCalls(10, "10 calls on s0")
	s0.kill()
	addr1 := s1.waitListening(t)
	n, _ := calls()
	waitCalls(n+20, "20 calls once s1 listens")
	close(stop)
	<-done
	if _, err := calls(); err != nil {
		t.Fatalf("a call failed through the failover: %v", err)
	}
	total, _ := calls()
	t.Logf("%d calls, %d extents held", total, len(held))

	after := waitTopology(t, c, "d0 owned by s1", func(topo *pb.Topology) bool {
		return topoDevice(topo, "d0").GetServer() == "s1"
	})
	d1 := topoDevice(after, "d0")
	if d1.GetAddress() != addr1 || d1.GetEpoch() <= d0.GetEpoch() {
		t.Fatalf("d0 after the failover: %v; before: %v; want it at %s with a higher epoch", d1, d0, addr1)
	}
	disjoint(t, held)
	for _, e := range held {
		if e.End() > d0.GetCapacityBlocks() {
			t.Fatalf("extent %s past the device's %d blocks", e, d0.GetCapacityBlocks())
		}
	}
	freeOnceEach(t, ctx, c, "d0", held)
	holdsNothing(t, ctx, addr1, "d0")
}
