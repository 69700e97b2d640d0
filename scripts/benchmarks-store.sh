#!/usr/bin/env bash
# Reproduces the durable-store and trace measurements in BENCHMARKS.md.
# About 6 minutes on 2 cores; needs ~20 GiB free under $DIR (the 16 TiB
# device is a sparse file). Output: bench-out/store-*.txt, bench-out/trace-*.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
B=${BLOCKALLOC_BIN:-./target/release/blockalloc}
DIR=${BLOCKALLOC_BENCH_DIR:-/work/bench}
mkdir -p bench-out "$DIR"
log() { local name=$1; shift; echo "== $name: $*"; "$@" 2>&1 | tee "bench-out/store-$name.txt"; }

# Group commit: one operation per transaction, 1 and 8 committing threads.
for t in 1 8; do
  $B format --device "$DIR/gc" --size 2TiB --sparse --force >/dev/null
  log "group-commit-$t" $B bench --device "$DIR/gc" --batch 1 --threads $t --round-size 2000 --time-limit 10
done

# Journal overhead against the in-memory engine, and reopen time of a
# 16 TiB device (ext4's largest file: 16 TiB - 4 KiB).
BIG=17592186040320
log engine-120 $B bench --capacity $BIG --max-rounds 120
$B format --device "$DIR/big" --size $BIG --sparse --force >/dev/null
log durable-120 $B bench --device "$DIR/big" --batch 1000 --max-rounds 120
$B format --device "$DIR/big" --size $BIG --sparse --force >/dev/null
log durable-full $B bench --device "$DIR/big" --batch 1000
log inspect-full $B inspect --device "$DIR/big"

# Preallocation (docs/background.md): object writes into allocated extents.
for prep in "--sparse" "--zero none" "--zero range" "--zero now"; do
  tag=$(echo "$prep" | tr -d ' -')
  /usr/bin/time -f "format: %e s" $B format --device "$DIR/pa" --size 4GiB $prep --force
  log "prealloc-$tag-big" $B bench --device "$DIR/pa" --write-data --batch 16 --round-size 500 --max-rounds 3
  $B format --device "$DIR/pa" --size 4GiB $prep --force >/dev/null
  log "prealloc-$tag-4k" $B bench --device "$DIR/pa" --write-data --batch 1 --sizes fixed:4KiB --round-size 20000 --max-rounds 1
done

# Traces: generate, replay through every engine, verify every byte.
$B trace gen --workload churn --capacity 4GiB --round-size 10000 -o bench-out/trace-churn.trace
$B trace info bench-out/trace-churn.trace | tee bench-out/trace-churn-info.txt
$B replay bench-out/trace-churn.trace --engine all --quiet --json bench-out/trace-churn-replay.jsonl
log replay-verify $B replay bench-out/trace-churn.trace --engine segfit --verify --device "$DIR/verify.img" --force
