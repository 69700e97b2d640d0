#!/usr/bin/env bash
# Reproduces the engine and thread measurements in BENCHMARKS.md.
# Output: bench-out/*.jsonl (render with scripts/bench_table.py).
# About 40 minutes on 2 cores: the seed engines near full are slow, and each
# is bounded by --time-limit. Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --features peers
B=${BLOCKALLOC_BIN:-./target/release/blockalloc}
mkdir -p bench-out
run() { local name=$1; shift; echo "== $name: blockalloc bench $*"; $B bench --quiet --json "bench-out/$name.jsonl" "$@"; }

# Every engine on the seed workload.
for p in 0.5 0.8; do
  for mode in contiguous scattered; do
    run "seed-2TiB-p$p-$mode" --capacity 2TiB --round-size 10000 --free-prob $p --mode $mode \
      --engine segfit,bitmap,groups,pool --time-limit 120
    run "seed-16TiB-p$p-$mode" --capacity 16TiB --round-size 100000 --free-prob $p --mode $mode \
      --engine segfit,bitmap,groups,pool --time-limit 120
  done
done
# Workload shifts; pool with and without compaction; other mixes.
run shift-16TiB --workload shift --engine segfit,pool,pool-compact
run shift-16TiB-r10k --workload shift --round-size 10000 --engine segfit,pool,pool-compact
run fill-shift-1TiB --workload fill-shift --capacity 1TiB --round-size 10000 \
  --engine segfit,pool,pool-compact,groups,bitmap --time-limit 120
run lognormal-16TiB --sizes lognormal:64KiB:1.5 --engine segfit,pool,groups --time-limit 300
# Peers, at a capacity they support (offset-allocator takes < 2^32 blocks).
run peers-8TiB --capacity 8TiB --engine segfit,pool,peer-offset-allocator,peer-range-alloc --time-limit 120
# Threads, three times (the machine is shared: compare within a run).
for i in 1 2 3; do run "threads-16TiB-$i" --threads 1,2,8; done
