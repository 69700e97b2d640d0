#!/usr/bin/env bash
# The client/server experiment side by side: the in-process engine, then a
# server on a loopback port driven per call and with leases, 1 and N
# clients, then the Go client's benchmark against the same server binary.
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
B=$PWD/target/release/blockalloc
work=$(mktemp -d)
server=
cleanup() {
    [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

start_server() {
    rm -f "$work/dev"
    "$B" serve --device "$work/dev" --format "$SIZE" --listen 127.0.0.1:0 >"$work/out" 2>"$work/err" &
    server=$!
    for _ in $(seq 600); do grep -q listening "$work/out" && break; sleep 0.1; done
    addr=$(head -1 "$work/out" | cut -d' ' -f3)
}
stop_server() {
    kill -TERM "$server"
    wait "$server" || true
    server=
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
if command -v go >/dev/null; then
    echo "== Go client, per call and leased" >&2
    (cd clients/go && BLOCKALLOC_BIN=$B BLOCKALLOC_BENCH_SIZE=$SIZE BLOCKALLOC_BENCH_ROUND=$ROUND \
        BLOCKALLOC_BENCH_ROUNDS=$ROUNDS go test -run '^$' -bench Experiment -benchtime 1x -timeout 0 .) |
        tee "$OUT/go.txt"
fi
