#!/usr/bin/env bash
# The client/server experiment side by side: the in-process engine, then a
# server on a loopback port driven per call and with leases, 1 and N
# clients (per call also on tmpfs); the
# expiry of a killed client's leases; commits per second; the server's
# start on a full 2 TiB device; then the Go client's benchmark against the
# same server binary.
#
#   scripts/benchmarks-service.sh [SIZE] [ROUND] [ROUNDS] [CLIENTS]
#
# Defaults: a 32GiB device (fallocated: it needs that much free space), rounds of 1000 requests, 3 rounds, 8 clients.
# JSON records go to $OUT (default target/benchmarks-service), one file per
# run; a table per run goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-32GiB}
ROUND=${2:-1000}
ROUNDS=${3:-3}
CLIENTS=${4:-8}
OUT=${OUT:-target/benchmarks-service}
mkdir -p "$OUT"
cargo build --release -q -p blockalloc-cli
B=${CARGO_TARGET_DIR:-$PWD/target}/release/blockalloc
# On a VM, per-call latency depends on how fast an idle vCPU wakes: a
# guest that halts at once (a setting of 0) pays a host exit on every wake.
hp=/sys/module/haltpoll/parameters/guest_halt_poll_ns
if [ -r "$hp" ]; then
    echo "== guest halt polling: $(cat "$hp") ns (BENCHMARKS.md, \"The floor\")" >&2
fi
work=$(mktemp -d)
server=
cleanup() {
    [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$work"
    [ -n "${shm:-}" ] && rm -rf "$shm"
    true
}
trap cleanup EXIT

# start_server [DIR [sparse]]: a fresh device in DIR (default: the work
# directory, on disk), served on a loopback port. "sparse" formats it
# without allocating its blocks (a memory-backed DIR may be smaller than
# SIZE; the bench writes metadata only).
start_server() {
    dev=${1:-$work}/blockalloc-bench-dev
    rm -f "$dev"
    fmt=(--format "$SIZE")
    if [ "${2:-}" = sparse ]; then
        "$B" format --device "$dev" --size "$SIZE" --sparse >/dev/null
        fmt=()
    fi
    "$B" serve --device "$dev" "${fmt[@]}" --listen 127.0.0.1:0 ${TTL:+--lease-ttl "$TTL"} \
        ${CONFIG:+--config "$CONFIG"} >"$work/out" 2>"$work/err" &
    server=$!
    for _ in $(seq 600); do grep -q listening "$work/out" && break; sleep 0.1; done
    if ! grep -q listening "$work/out"; then
        echo "benchmarks-service: the server did not start:" >&2
        cat "$work/err" >&2
        exit 1
    fi
    addr=$(head -1 "$work/out" | cut -d' ' -f3)
}
stop_server() {
    kill -TERM "$server"
    wait "$server" || true
    server=
    rm -f "$dev"
}

echo "== in-process segfit, same workload" >&2
"$B" bench --engine segfit --capacity "$SIZE" --round-size "$ROUND" --max-rounds "$ROUNDS" \
    --json "$OUT/local.jsonl"
for lease in off auto; do
    for clients in 1 "$CLIENTS"; do
        echo "== remote, --lease $lease, $clients client(s)" >&2
        start_server
        "$B" bench --remote "$addr" --lease "$lease" --clients "$clients" \
            --round-size "$ROUND" --max-rounds "$ROUNDS" --json "$OUT/remote-$lease-$clients.jsonl"
        stop_server
    done
done
# Per call on a memory-backed device beside the disk-backed runs above:
# the difference is the device sync, the rest is the RPC.
if [ -d /dev/shm ]; then
    shm=$(mktemp -d /dev/shm/blockalloc-bench.XXXXXX)
    echo "== remote, --lease off, 1 client, device on tmpfs" >&2
    start_server "$shm" sparse
    "$B" bench --remote "$addr" --lease off --clients 1 \
        --round-size "$ROUND" --max-rounds "$ROUNDS" --json "$OUT/remote-off-1-tmpfs.jsonl"
    stop_server
    rm -rf "$shm"
fi
# How long a SIGKILLed client's leased space takes to come back: a leasing
# client runs until it holds leases, is killed, and Status is polled until
# no lease and no leased block is left (lease TTL 2 s). Its rounds are
# short and it frees every object at each round's end, so that it never
# fills the device and ends on its own before the kill.
leased() {
    "$B" status --remote "$addr" --json |
        python3 -c 'import json,sys; d=json.load(sys.stdin)["devices"][0]; print(d["leases"], d["leased_blocks"])'
}
echo "== expiry of a killed leasing client's space (lease TTL 2 s)" >&2
TTL=2 start_server
"$B" bench --remote "$addr" --lease auto --clients 1 --round-size 100 --time-limit 60 \
    --free-prob 1 --quiet --json /dev/null &
client=$!
for _ in $(seq 600); do [ "$(leased | cut -d' ' -f1)" != 0 ] && break; sleep 0.05; done
held=$(leased)
kill -KILL "$client"
wait "$client" 2>/dev/null || true
t0=$(date +%s.%N)
while [ "$(leased)" != "0 0" ]; do sleep 0.02; done
t1=$(date +%s.%N)
echo "killed holding (leases, leased blocks) = ($held); all back after $(python3 -c "print(f'{$t1 - $t0:.2f}')") s" |
    tee "$OUT/expiry.txt" >&2
stop_server
# Commits per second: a leasing client that commits after every
# allocation, 1 and N clients, on the Calls stream and as unary calls.
for unary in "" --unary-calls; do
    for clients in 1 "$CLIENTS"; do
        echo "== commits: a commit after every leased allocation, $clients client(s)${unary:+, unary}" >&2
        start_server
        "$B" bench --remote "$addr" --lease auto --clients "$clients" --sizes fixed:64KiB \
            --round-size $((clients * 1000)) --max-rounds 2 --commit-every 1 $unary \
            --json "$OUT/commits-$clients${unary:+-unary}.jsonl"
        stop_server
    done
done
# Restart: a 2 TiB sparse device filled by the seed workload to its first
# failure, then the server started three times, each timed to its
# "listening" line (polled every 5 ms) and stopped with SIGTERM.
echo "== server restart on a 2 TiB device after the seed workload" >&2
big=$work/blockalloc-restart-dev
"$B" format --device "$big" --size 2TiB --sparse >/dev/null
"$B" bench --device "$big" --keep --quiet --json "$OUT/restart-fill.jsonl"
for i in 1 2 3; do
    t0=$(date +%s.%N)
    "$B" serve --device "$big" --listen 127.0.0.1:0 >"$work/out" 2>"$work/err" &
    server=$!
    for _ in $(seq 12000); do grep -q listening "$work/out" && break; sleep 0.005; done
    t1=$(date +%s.%N)
    grep -q listening "$work/out" || { cat "$work/err" >&2; exit 1; }
    echo "start $i: listening after $(python3 -c "print(f'{$t1 - $t0:.3f}')") s" | tee -a "$OUT/restart.txt" >&2
    kill -TERM "$server"
    wait "$server" || true
    server=
done
rm -f "$big"
if command -v go >/dev/null; then
    echo "== Go client, per call and leased" >&2
    (cd clients/go && BLOCKALLOC_BIN=$B BLOCKALLOC_BENCH_SIZE=$SIZE BLOCKALLOC_BENCH_ROUND=$ROUND \
        BLOCKALLOC_BENCH_ROUNDS=$ROUNDS go test -run '^$' -bench Experiment -benchtime 1x -timeout 0 .) |
        tee "$OUT/go.txt"
fi
