package blockalloc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The original client/server experiment: a device of 2 TiB with 4 KiB
// blocks; rounds of 100 000 allocations of 0-4 MiB (uniform), each object
// freed with probability 1/2 in one batch at the end of its round; run
// until the first allocation fails. Per call (one Allocate RPC per object)
// versus leased (allocation inside leased regions, batched commits).
//
// Scale it with the environment:
//
//	BLOCKALLOC_BENCH_SIZE    device size (default 2TiB; a sparse file)
//	BLOCKALLOC_BENCH_ROUND   allocations per round (default 100000)
//	BLOCKALLOC_BENCH_ROUNDS  stop after this many rounds (default 0: at
//	                         the first failure)
//	BLOCKALLOC_BENCH_DIR     where the device file goes (default a
//	                         temporary directory; /dev/shm takes the
//	                         disk's fsync out of the per-call time)
//
// Run it once per mode, without go test's 10-minute limit:
//
//	go test -run '^$' -bench Experiment -benchtime 1x -timeout 0 .
//
// It reports ns/alloc (time per allocation call, frees and commits at the
// end of a round not included), its median and 99th percentile
// (p50-ns/alloc, p99-ns/alloc), used% (committed blocks over capacity when
// the first allocation failed, or at the last round) and held% (space not
// free for others: used plus leased and not yet used).
func BenchmarkExperiment(b *testing.B) {
	cfg := experimentConfig{size: "2TiB", round: 100_000, freeP: 0.5}
	if v := os.Getenv("BLOCKALLOC_BENCH_SIZE"); v != "" {
		cfg.size = v
	}
	cfg.round = envInt(b, "BLOCKALLOC_BENCH_ROUND", cfg.round)
	cfg.rounds = envInt(b, "BLOCKALLOC_BENCH_ROUNDS", 0)
	for _, leased := range []bool{false, true} {
		name := "rpc"
		if leased {
			name = "leased"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				runExperiment(b, cfg, leased)
			}
		})
	}
}

type experimentConfig struct {
	size   string
	round  int
	rounds int
	freeP  float64
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		b.Fatalf("%s=%q is not a count", name, v)
	}
	return n
}

func runExperiment(b *testing.B, cfg experimentConfig, leased bool) {
	b.StopTimer()
	dir := b.TempDir()
	if d := os.Getenv("BLOCKALLOC_BENCH_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "blockalloc-bench-"); err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(dir)
	}
	dev := filepath.Join(dir, "dev0")
	out, err := exec.Command(serverBin(b), "format", "--device", dev, "--size", cfg.size, "--sparse").CombinedOutput()
	if err != nil {
		b.Fatalf("blockalloc format: %v: %s", err, out)
	}
	s := startServer(b, serverOpts{device: dev})
	defer s.stop()
	c := s.dial(b)
	// The experiment runs until the device is full: no deadline.
	ctx := context.Background()
	var l *Leasing
	if leased {
		// The original client preallocated 16 GiB at a time; the server
		// caps a lease at its own maximum.
		l = c.NewLeasing(LeaseOptions{MinBlocks: 1024, WantBlocks: 16 << 30 / 4096})
		defer l.Close(ctx)
	}
	rng := rand.New(rand.NewPCG(0x5eed, 0))
	var allocs int
	var spent time.Duration
	// Each allocation call's time, for the median and the tail.
	var lat []time.Duration
	failed := false
	round := 0
	for ; !failed && (cfg.rounds == 0 || round < cfg.rounds); round++ {
		toFree := make([]Extent, 0, cfg.round)
		before := allocs
		start := time.Now()
		for range cfg.round {
			n := 1 + uint64(rng.IntN(1024)) // 0-4 MiB, rounded up to 4 KiB blocks
			var e Extent
			var err error
			t0 := time.Now()
			if leased {
				e, err = l.Allocate(ctx, n)
			} else {
				e, err = c.Allocate(ctx, n)
			}
			lat = append(lat, time.Since(t0))
			if errors.Is(err, ErrNoSpace) {
				failed = true
				st := devStatus(b, c)
				b.Logf("round %d: first failure: %d blocks: %v; free %d blocks, leased unused %d, largest free run %d",
					round, n, err, st.FreeBlocks, st.LeasedUnusedBlocks, st.LargestFreeExtent)
				break
			} else if err != nil {
				b.Fatalf("round %d: %v", round, err)
			}
			allocs++
			if rng.Float64() < cfg.freeP {
				toFree = append(toFree, e)
			}
		}
		took := time.Since(start)
		spent += took
		if !failed {
			freeAll(b, c, l, toFree)
		}
		if leased {
			if err := l.Commit(ctx); err != nil {
				b.Fatalf("round %d: commit: %v", round, err)
			}
		}
		st := devStatus(b, c)
		b.Logf("round %d: %d allocations in %v (%.2f us each), used %.4f%s",
			round, allocs-before, took.Round(time.Millisecond), float64(took.Nanoseconds())/1e3/float64(max(allocs-before, 1)),
			float64(st.UsedBlocks)/float64(st.CapacityBlocks), map[bool]string{true: " (first failure)"}[failed])
	}
	st := devStatus(b, c)
	used := float64(st.UsedBlocks) / float64(st.CapacityBlocks)
	held := float64(st.CapacityBlocks-st.FreeBlocks) / float64(st.CapacityBlocks)
	b.ReportMetric(float64(spent.Nanoseconds())/float64(max(allocs, 1)), "ns/alloc")
	p50, p99 := quantile(lat, 0.5), quantile(lat, 0.99)
	b.ReportMetric(float64(p50.Nanoseconds()), "p50-ns/alloc")
	b.ReportMetric(float64(p99.Nanoseconds()), "p99-ns/alloc")
	b.ReportMetric(100*used, "used%")
	b.ReportMetric(100*held, "held%")
	b.ReportMetric(float64(round), "rounds")
	b.ReportMetric(0, "ns/op")
	if l != nil {
		b.Logf("leased: %+v", l.Stats())
	}
	fmt.Fprintf(os.Stderr, "experiment leased=%v size=%s: %d allocations in %d rounds, %.2f us each (p50 %.1f us, p99 %.1f us); first failure: %v; used %.4f, held %.4f\n",
		leased, cfg.size, allocs, round, float64(spent.Nanoseconds())/1e3/float64(max(allocs, 1)),
		float64(p50.Nanoseconds())/1e3, float64(p99.Nanoseconds())/1e3, failed, used, held)
}

// quantile is the q-quantile of ds (0 for none); it sorts ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// freeAll frees a round's batch: per call in Free RPCs of MaxBatch extents,
// leased through the allocator (committed with the round).
func freeAll(b *testing.B, c *Client, l *Leasing, es []Extent) {
	if l != nil {
		for _, e := range es {
			if err := l.Free(e); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	ctx := context.Background()
	for i := 0; i < len(es); i += MaxBatch {
		if _, err := c.Free(ctx, es[i:min(i+MaxBatch, len(es))]...); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLeasingLocalAllocate is the leased fast path: an allocation
// served from a held lease, and the free of an uncommitted allocation back
// into it, with the background goroutine paused (no commits or renewals
// in the measurement).
//
//	go test -run '^$' -bench LeasingLocalAllocate -count 10 .
func BenchmarkLeasingLocalAllocate(b *testing.B) {
	s := startServer(b, serverOpts{size: "64GiB", extra: []string{"--sparse"}})
	c := s.dial(b)
	ctx := ctxT(b)
	l := c.NewLeasing(LeaseOptions{MinBlocks: 1 << 14, WantBlocks: 1 << 14})
	defer l.Close(ctx)
	first, err := l.Allocate(ctx, 1)
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Free(first); err != nil {
		b.Fatal(err)
	}
	resume := l.pause()
	defer resume()
	rng := rand.New(rand.NewPCG(3, 4))
	live := make([]Extent, 0, 1024)
	// CPU time as well as wall time: on a shared machine the wall time
	// mostly measures the other processes.
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	b.ResetTimer()
	for range b.N {
		if len(live) == cap(live) {
			for _, e := range live[:len(live)/2] {
				if err := l.Free(e); err != nil {
					b.Fatal(err)
				}
			}
			live = append(live[:0], live[len(live)/2:]...)
		}
		e, ok := l.TryAllocateLocal(1 + uint64(rng.IntN(16)))
		if !ok {
			b.Fatal("the lease is full")
		}
		live = append(live, e)
	}
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano()
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
}
