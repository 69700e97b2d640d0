#!/usr/bin/env bash
# How the product scales with cores: the engine's threads, the durable
# store's committing threads, and a server's clients (leased and per call,
# on tmpfs and on disk), each at 1, 8 and 16 threads or clients, printed as
# one Markdown table with the server's CPU per operation beside every
# service figure. Runs on any machine; the goals are for 16 cores or more.
#
#   scripts/manycore.sh
#
# Environment: COUNTS (default "1 8 16"), DISK (a directory on the disk to
# measure, default target/manycore), SECS (seconds per service and store
# run, default 10), ENGINE_CAPACITY (default 16TiB), NO_BUILD=1 to use the
# release binary as it is, BIN=PATH to use another one (a stripped copy
# carried to a bigger machine). Records go to $OUT (default
# target/manycore), one JSON file per run.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNTS=${COUNTS:-"1 8 16"}
SECS=${SECS:-10}
ENGINE_CAPACITY=${ENGINE_CAPACITY:-16TiB}
OUT=${OUT:-target/manycore}
DISK=${DISK:-$OUT}
mkdir -p "$OUT" "$DISK"
if [ -z "${BIN:-}" ]; then
    [ -n "${NO_BUILD:-}" ] || cargo build --release -q -p blockalloc-cli
    BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/blockalloc
fi
B=$BIN
shm=$(mktemp -d /dev/shm/blockalloc-manycore.XXXXXX)
server=
cleanup() {
    [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$shm" "$DISK/manycore-dev"
    true
}
trap cleanup EXIT
counts_csv=$(echo "$COUNTS" | tr ' ' ',')
log() { echo "== $*" >&2; }

# A fresh server on a fresh sparse device: start_server PATH SIZE.
start_server() {
    rm -f "$1"
    "$B" format --device "$1" --size "$2" --sparse >/dev/null
    "$B" serve --device "$1" --listen 127.0.0.1:0 >"$shm/out" 2>"$shm/err" &
    server=$!
    for _ in $(seq 600); do grep -q listening "$shm/out" && break; sleep 0.1; done
    grep -q listening "$shm/out" || { cat "$shm/err" >&2; exit 1; }
    addr=$(head -1 "$shm/out" | cut -d' ' -f3)
}
stop_server() {
    kill -TERM "$server"
    wait "$server" || true
    server=
}

# cells JQ_EXPR FILE_PREFIX: one table cell per count, from PREFIX-N.json.
cells() {
    local expr=$1 prefix=$2 line=""
    for n in $COUNTS; do
        line+=" $(jq -r "$expr" "$prefix-$n.json") |"
    done
    echo "$line"
}

log "engine: bench --threads $counts_csv --repeat 3 --capacity $ENGINE_CAPACITY"
"$B" bench --threads "$counts_csv" --repeat 3 --capacity "$ENGINE_CAPACITY" --quiet \
    --json "$OUT/engine.jsonl"
engine_cell() {
    # The three repeats of one thread count: the range.
    jq -s -r --argjson t "$1" --arg f "$2" '
        [.[] | select(.threads == $t)] as $r
        | if $f == "ops" then ($r | map(.ops_per_sec / 1e6)) | "\(min * 100 | round / 100)–\(max * 100 | round / 100)"
          else ($r | map(.alloc_ns.p999 / 1000)) as $a | ($r | map(.free_ns.p999 / 1000)) as $b
            | "\($a | min * 10 | round / 10)–\($a | max * 10 | round / 10) / \($b | min * 10 | round / 10)–\($b | max * 10 | round / 10) µs"
          end' "$OUT/engine.jsonl"
}

for n in $COUNTS; do
    log "durable store: $n threads, batch 64, 256 GiB sparse file in $DISK"
    rm -f "$DISK/manycore-dev"
    "$B" format --device "$DISK/manycore-dev" --size 256GiB --sparse >/dev/null
    "$B" bench --device "$DISK/manycore-dev" --batch 64 --threads "$n" --time-limit "$SECS" \
        --quiet --json "$OUT/store-$n.json"
    # On tmpfs a sync costs next to nothing: what is left is the commit's
    # own work, and how much of it is serial.
    log "durable store: $n threads, batch 64, 1 TiB sparse tmpfs file"
    rm -f "$shm/store"
    "$B" format --device "$shm/store" --size 1TiB --sparse >/dev/null
    "$B" bench --device "$shm/store" --batch 64 --threads "$n" --time-limit "$SECS" \
        --quiet --json "$OUT/store-tmpfs-$n.json"
    rm -f "$shm/store"
done

for n in $COUNTS; do
    # Away from full, however fast the machine: the end of a device goes
    # per call by design (see "Near full" in BENCHMARKS.md).
    log "service, leased, $n clients, 4 M operations on a 16 TiB tmpfs device"
    start_server "$shm/dev" 16TiB
    "$B" bench --remote "$addr" --clients "$n" --max-ops 4000000 --quiet \
        --json "$OUT/leased-$n.json"
    stop_server
    log "service, per call, $n clients, 64 KiB objects, tmpfs"
    start_server "$shm/dev" 2TiB
    "$B" bench --remote "$addr" --lease off --clients "$n" --sizes fixed:64KiB \
        --time-limit "$SECS" --quiet --json "$OUT/percall-$n.json"
    stop_server
    log "service, per call, $n clients, 64 KiB objects, 256 GiB sparse file in $DISK"
    start_server "$DISK/manycore-dev" 256GiB
    "$B" bench --remote "$addr" --lease off --clients "$n" --sizes fixed:64KiB \
        --time-limit "$SECS" --quiet --json "$OUT/disk-$n.json"
    stop_server
done

k='def k: if . >= 1e6 then "\(. / 1e6 * 100 | round / 100) M" else "\(. / 1e3 | round) k" end;
   def us: "\(. / 1000 * 100 | round / 100) µs";'
echo "Machine: $(nproc) cores, $(uname -m), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); $(date -u +%F)"
echo
printf '| path |'
for n in $COUNTS; do printf ' %s |' "$n"; done
printf '\n|---|'
for _ in $COUNTS; do printf -- '---|'; done
echo
printf '| engine, Mops/s |'
for n in $COUNTS; do printf ' %s |' "$(engine_cell "$n" ops)"; done
echo
printf '| engine p99.9 alloc / free |'
for n in $COUNTS; do printf ' %s |' "$(engine_cell "$n" tail)"; done
echo
echo "| durable store, batch 64, ops/s |$(cells "$k .ops_per_sec | k" "$OUT/store")"
echo "| ″ on tmpfs (the commit's CPU alone) |$(cells "$k .ops_per_sec | k" "$OUT/store-tmpfs")"
echo "| leased (16 TiB, 4 M operations), committed allocations/s |$(cells "$k .allocations_per_sec | k" "$OUT/leased")"
echo "| leased allocation mean / p99 |$(cells "$k \"\(.alloc_ns.mean | us) / \(.alloc_ns.p99 | us)\"" "$OUT/leased")"
echo "| leased, server CPU per allocation or free |$(cells "$k .server_cpu_ns_per_op | us" "$OUT/leased")"
echo "| per call, tmpfs, allocations/s (p50) |$(cells "$k \"\(.allocations_per_sec | k) (\(.alloc_ns.p50 | us))\"" "$OUT/percall")"
echo "| per call, tmpfs, server CPU per allocation or free |$(cells "$k .server_cpu_ns_per_op | us" "$OUT/percall")"
echo "| per call, disk, allocations/s (p50) |$(cells "$k \"\(.allocations_per_sec | k) (\(.alloc_ns.p50 | us))\"" "$OUT/disk")"
