#!/usr/bin/env bash
# The server's CPU time per operation: a fresh server on a sparse 256 GiB
# tmpfs device (no disk latency), driven by `bench --remote` with 64 KiB
# objects, its user + system time read from /proc before and after each
# run (the frees of what is left at the end included), and as the server
# reports it over the rounds alone (`server_cpu_ns_per_op`). Rows: per-call
# allocations and frees (1 and N clients), leased ones committed every C
# allocations (1 and N clients; 10 times the rounds, the clock ticks being
# 10 ms), and two leasing clients of the notes' workload to the first
# failure (the end of the device included).
#
#   scripts/server-cpu.sh [ROUND] [ROUNDS] [CLIENTS] [COMMIT_EVERY]
#
# Defaults: rounds of 20000 requests, 3 rounds, 8 clients, a commit every
# 64 leased allocations. Prints a Markdown table to stdout. SERVER_BIN=PATH
# serves with another build (the clients stay this build's), to compare two
# servers under the same load.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUND=${1:-20000}
ROUNDS=${2:-3}
CLIENTS=${3:-8}
EVERY=${4:-64}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p blockalloc-cli
B=${CARGO_TARGET_DIR:-$PWD/target}/release/blockalloc
S=${SERVER_BIN:-$B}
work=$(mktemp -d /dev/shm/blockalloc-cpu.XXXXXX)
server=
cleanup() {
    [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$work"
    true
}
trap cleanup EXIT
tck=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# row NAME LEASE CLIENTS [BENCH FLAGS...]
row() {
    local name=$1 lease=$2 clients=$3 rounds=$4
    shift 4
    rm -f "$work/dev"
    "$S" format --device "$work/dev" --size 256GiB --sparse >/dev/null
    "$S" serve --device "$work/dev" --listen 127.0.0.1:0 >"$work/out" 2>"$work/err" &
    server=$!
    for _ in $(seq 600); do grep -q listening "$work/out" && break; sleep 0.1; done
    grep -q listening "$work/out" || { cat "$work/err" >&2; exit 1; }
    local addr c0 c1
    addr=$(head -1 "$work/out" | cut -d' ' -f3)
    c0=$(ticks "$server")
    "$B" bench --remote "$addr" --lease "$lease" --clients "$clients" --round-size "$ROUND" \
        --max-rounds "$rounds" --quiet --json "$work/r.json" "$@"
    c1=$(ticks "$server")
    kill -TERM "$server"
    wait "$server" || true
    server=
    local allocs frees wall rounds
    allocs=$(jq -r .allocations "$work/r.json")
    frees=$(jq -r .frees "$work/r.json")
    wall=$(jq -r .wall_secs "$work/r.json")
    # The server's own figure over the rounds alone (servers that report
    # their CPU time in Status replies).
    rounds=$(jq -r '.server_cpu_ns_per_op // empty | . / 1000 * 100 | round / 100 | "\(.) µs"' "$work/r.json")
    awk -v n="$name" -v a="$allocs" -v f="$frees" -v t=$((c1 - c0)) -v hz="$tck" -v w="$wall" \
        -v r="${rounds:-—}" \
        'BEGIN { ops = a + f; printf "| %s | %d | %d | %.2f s | %.2f µs | %s | %.0f |\n", n, a, f, t / hz, t / hz * 1e6 / ops, r, a / w }'
}

echo "| run | allocations | frees | server CPU | per allocation or free | in the rounds | allocations/s |"
echo "|---|---:|---:|---:|---:|---:|---:|"
F=(--sizes fixed:64KiB)
row "per call, 1 client" off 1 "$ROUNDS" "${F[@]}"
row "per call, $CLIENTS clients" off "$CLIENTS" "$ROUNDS" "${F[@]}"
row "leased, commit every $EVERY, 1 client" auto 1 $((ROUNDS * 10)) --commit-every "$EVERY" "${F[@]}"
row "leased, commit every $EVERY, $CLIENTS clients" auto "$CLIENTS" $((ROUNDS * 10)) --commit-every "$EVERY" "${F[@]}"
# Leases of one object: every allocation takes a grant (or an extension).
row "leased, a grant per allocation, $CLIENTS clients" 64KiB "$CLIENTS" "$ROUNDS" --commit-every 1 "${F[@]}"
# The notes' sizes to the first failure: the end of the device too.
row "leased, notes' workload to the first failure, 2 clients" auto 2 1000000
