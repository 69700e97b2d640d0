#!/usr/bin/env bash
# How far 8 leasing clients fill a device before the first failure, beside
# the same 8 clients with every allocation per call (one engine, the
# server's, serving every request as it comes) and beside one engine
# in-process on the requests each run made, in the order made
# (`--reference segfit`).
#
#   scripts/near-full.sh SIZE ROUND SEEDS [bench args...]
#
# e.g. scripts/near-full.sh 8GiB 1600 40, or
#      scripts/near-full.sh 8GiB 10000 40 --workload lognormal
#
# For each seed 1..SEEDS and each mode of $MODES (default "auto off":
# --lease auto, then --lease off), a fresh server on a sparse SIZE file in
# $DIR (default /dev/shm: the runs measure placement, not the disk) runs
# `bench --remote --clients $CLIENTS` (default 8) to the first failure.
# JSON records go to $OUT (default target/near-full), one line per run;
# the summary goes to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 3 ]; then
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
SIZE=$1
ROUND=$2
SEEDS=$3
shift 3
CLIENTS=${CLIENTS:-8}
MODES=${MODES:-auto off}
DIR=${DIR:-/dev/shm}
OUT=${OUT:-target/near-full}
mkdir -p "$OUT"
cargo build --release -q -p blockalloc-cli
B=${CARGO_TARGET_DIR:-$PWD/target}/release/blockalloc
work=$(mktemp -d "$DIR/blockalloc-near-full.XXXXXX")
server=
cleanup() {
    [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$work"
    true
}
trap cleanup EXIT
extra=$(echo "$*" | sed 's/--//g; s/[^a-zA-Z0-9.]\+/_/g')
tag="$SIZE-$ROUND${extra:+-$extra}"
rm -f "$OUT/$tag-auto.jsonl" "$OUT/$tag-off.jsonl"
for mode in $MODES; do
    : >"$OUT/$tag-$mode.jsonl"
done
for seed in $(seq "$SEEDS"); do
    for mode in $MODES; do
        rm -f "$work/dev"
        "$B" format --device "$work/dev" --size "$SIZE" --sparse >/dev/null
        "$B" serve --device "$work/dev" --listen 127.0.0.1:0 >"$work/out" 2>"$work/err" &
        server=$!
        for _ in $(seq 2400); do grep -q listening "$work/out" && break; sleep 0.05; done
        if ! grep -q listening "$work/out"; then
            echo "near-full: the server did not start within 2 minutes (seed $seed, $mode):" >&2
            cat "$work/err" >&2
            ps -o pid,stat,wchan:24,etime,cmd -p "$server" >&2 || echo "(it exited)" >&2
            exit 1
        fi
        addr=$(head -1 "$work/out" | cut -d' ' -f3)
        "$B" bench --remote "$addr" --lease "$mode" --clients "$CLIENTS" --round-size "$ROUND" \
            --seed "$seed" --reference segfit --quiet --json - "$@" \
            >>"$OUT/$tag-$mode.jsonl"
        kill -TERM "$server"
        wait "$server" || true
        server=
    done
    echo "seed $seed done" >&2
done
python3 - "$OUT/$tag-auto.jsonl" "$OUT/$tag-off.jsonl" "$tag" "$CLIENTS" <<'EOF'
import json, statistics as st, sys

def load(path):
    runs = {}
    try:
        lines = open(path).readlines()
    except FileNotFoundError:
        return runs  # a mode not run ($MODES)
    for line in lines:
        r = json.loads(line)
        u, ref = r["utilization_at_first_failure"], r["reference"]["utilization_at_first_failure"]
        if u is None or ref is None:
            continue  # the workload ended before the device filled
        # The engine refused the request the server refused, or an earlier
        # one: the server failed no earlier than one engine would have.
        same = r["reference"]["failed_within_order"] or r["reference"]["refused_the_same_request"]
        runs[r["seed"]] = (100 * u, 100 * ref, r["per_call_fallbacks"] / max(1, r["allocations"]), same)
    return runs

leased, per_call = load(sys.argv[1]), load(sys.argv[2])
print(f"{sys.argv[3]}: {sys.argv[4]} clients, used at the first failure, % of the device")
print("| clients | runs | median (range) | mean | within 0.1 % of the engine on the same requests | median short of it | worst | the engine failed no later |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name, runs in (("leasing", leased), ("per call", per_call)):
    if not runs:
        continue
    u = [v[0] for v in runs.values()]
    short = [v[1] - v[0] for v in runs.values()]
    print(f"| {name} | {len(runs)} | {st.median(u):.3f} ({min(u):.3f}–{max(u):.3f}) | {st.mean(u):.4f} "
          f"| {sum(s <= 0.1 for s in short)} | {st.median(short):.3f} | {max(short):.3f} "
          f"| {sum(v[3] for v in runs.values())} |")
both = sorted(set(leased) & set(per_call))
if both:
    d = [leased[s][0] - per_call[s][0] for s in both]
    print(f"\nleasing minus per call, seed by seed ({len(both)}): median {st.median(d):+.3f}, "
          f"mean {st.mean(d):+.4f} points; within 0.1 point: {sum(abs(x) <= 0.1 for x in d)}; "
          f"leasing ahead: {sum(x > 0 for x in d)}; allocations per call while leasing: "
          f"{100 * min(leased[s][2] for s in both):.0f}–{100 * max(leased[s][2] for s in both):.0f} %")
EOF
