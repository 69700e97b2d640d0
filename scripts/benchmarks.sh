#!/usr/bin/env bash
# Reproduces the measurements in BENCHMARKS.md. Output: bench-out/*.jsonl.
# Takes about an hour on 2 cores (the seed engines near full are slow; each
# is bounded by --time-limit).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --features peers
B=${BLOCKALLOC_BIN:-./target/release/blockalloc}
mkdir -p bench-out
run() { local name=$1; shift; echo "== $name: blockalloc bench $*"; $B bench --quiet --json "bench-out/$name.jsonl" "$@"; }

# Issue 2: every engine on the seed workload.
for p in 0.5 0.8; do
  for mode in contiguous scattered; do
    run "seed-2TiB-p$p-$mode" --capacity 2TiB --round-size 10000 --free-prob $p --mode $mode \
      --engine segfit,bitmap,groups,pool --time-limit 120
    run "seed-16TiB-p$p-$mode" --capacity 16TiB --round-size 100000 --free-prob $p --mode $mode \
      --engine segfit,bitmap,groups,pool --time-limit 300
  done
done
# Issue 3: the shift workload, pool with and without compaction.
run shift-16TiB --workload shift --engine segfit,pool,pool-compact
# Peers, at a capacity they support.
run peers-8TiB --capacity 8TiB --engine segfit,pool,peer-offset-allocator,peer-range-alloc --time-limit 120
# Issue 4: threads.
run threads-16TiB --threads 1,2,8
