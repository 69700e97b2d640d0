package blockalloc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serverBin is the blockalloc binary the tests run: $BLOCKALLOC_BIN, or the
// workspace's debug build.
func serverBin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("BLOCKALLOC_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "target", "debug", "blockalloc")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatalf("no server binary at %s (build it with `cargo build -p blockalloc-cli`, or set BLOCKALLOC_BIN): %v", abs, err)
	}
	return abs
}

// testServer is a `blockalloc serve` child process on a loopback port.
type testServer struct {
	t      testing.TB
	bin    string
	device string
	args   []string
	addr   string

	mu     sync.Mutex
	cmd    *exec.Cmd
	stderr *bytes.Buffer
}

type serverOpts struct {
	size     string   // --format SIZE for a new device; "" for an existing one
	leaseTTL string   // --lease-ttl SECS; "" for the default
	device   string   // device path; "" for one in a temporary directory
	extra    []string // more flags
}

func startServer(t testing.TB, o serverOpts) *testServer {
	t.Helper()
	s := &testServer{t: t, bin: serverBin(t), device: o.device}
	if s.device == "" {
		s.device = filepath.Join(t.TempDir(), "dev0")
	}
	if o.size != "" {
		s.args = append(s.args, "--format", o.size)
	}
	if o.leaseTTL != "" {
		s.args = append(s.args, "--lease-ttl", o.leaseTTL)
	}
	s.args = append(s.args, o.extra...)
	s.start("127.0.0.1:0")
	t.Cleanup(s.stop)
	return s
}

func (s *testServer) start(listen string) {
	s.t.Helper()
	args := append([]string{"serve", "--device", s.device, "--listen", listen}, s.args...)
	cmd := exec.Command(s.bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("cannot start %s: %v", s.bin, err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				lines <- a
			}
		}
		close(lines)
	}()
	select {
	case a, ok := <-lines:
		if !ok {
			_ = cmd.Wait()
			s.t.Fatalf("server exited before listening: %s", stderr.String())
		}
		s.addr = a
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		s.t.Fatalf("server did not print its address in 60 s: %s", stderr.String())
	}
	s.mu.Lock()
	s.cmd, s.stderr = cmd, stderr
	s.mu.Unlock()
}

// kill stops the server with SIGKILL: no checkpoint, no lease release.
func (s *testServer) kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// signal sends sig to the server; SIGSTOP returns once every thread of the
// server has stopped (the kernel stops them one by one, and on a loaded
// machine the last may go on serving well after the signal was sent).
func (s *testServer) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		t.Fatal("the server is not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if sig == syscall.SIGSTOP {
		pid := s.cmd.Process.Pid
		eventually(t, 60*time.Second, "the server's threads did not all stop", func() bool {
			return allStopped(pid)
		})
	}
}

// allStopped says whether every thread of process pid is stopped (state T
// in /proc).
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] != 'T' {
			return false
		}
	}
	return true
}

// restart starts the server again on the same device and address.
func (s *testServer) restart() {
	s.t.Helper()
	s.start(s.addr)
}

// stop ends the server with SIGTERM (a graceful stop), or SIGKILL after
// 20 s.
func (s *testServer) stop() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			s.t.Errorf("server: %v", err)
		} else if err != nil {
			s.t.Errorf("server exited with %v: %s", err, s.stderr.String())
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		s.t.Errorf("server did not stop on SIGTERM within 20 s")
	}
}

func (s *testServer) dial(t testing.TB) *Client {
	t.Helper()
	c, err := Dial(s.addr, Options{MaxReconnectDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func devStatus(t testing.TB, c *Client) *DeviceStatus {
	t.Helper()
	st, err := c.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// eventually polls cond every 20 ms for up to d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// beforeExpiry runs scenario (which starts its own server) until a run
// passes. A run that failed after more than ttl from its start proves
// nothing (a loaded machine can delay it, a renewal among others, that
// long, and the server may end any lease granted in it then) and is run
// again; one that failed sooner fails the test, as every lease it took was
// still live throughout, and so does the tenth run.
func beforeExpiry(t *testing.T, ttl time.Duration, scenario func(t testing.TB)) {
	t.Helper()
	const tries = 10
	for run := 1; ; run++ {
		r := &recordedRun{TB: t}
		start := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			scenario(r)
		}()
		<-done
		took := time.Since(start)
		if !r.failed {
			return
		}
		if took < ttl || run == tries {
			t.Fatalf("run %d (%v): %s", run, took, strings.Join(r.msgs, "; "))
		}
		t.Logf("run %d took %v, more than the TTL, and failed (%s): again", run, took, strings.Join(r.msgs, "; "))
	}
}

// recordedRun is a testing.TB whose failures end the run (its goroutine)
// and are recorded instead of failing the test.
type recordedRun struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (r *recordedRun) record(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.msgs = append(r.msgs, msg)
}

func (r *recordedRun) Error(args ...any)                 { r.record(fmt.Sprint(args...)) }
func (r *recordedRun) Errorf(format string, args ...any) { r.record(fmt.Sprintf(format, args...)) }
func (r *recordedRun) Fail()                             { r.record("failed") }
func (r *recordedRun) FailNow()                          { r.record("failed"); runtime.Goexit() }
func (r *recordedRun) Fatal(args ...any)                 { r.record(fmt.Sprint(args...)); runtime.Goexit() }
func (r *recordedRun) Fatalf(format string, args ...any) {
	r.record(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (r *recordedRun) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// disjoint fails the test if two extents overlap.
func disjoint(t testing.TB, es []Extent) {
	t.Helper()
	s := append([]Extent(nil), es...)
	sortByStart(s)
	for i := 1; i < len(s); i++ {
		if s[i-1].End() > s[i].Start {
			t.Fatalf("extents %s and %s overlap", s[i-1], s[i])
		}
	}
}
