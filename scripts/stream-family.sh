#!/usr/bin/env bash
# segfit, pool and groups beside a plain best fit on a random family of
# streams: each stream draws a workload (stationary rounds, shift,
# fill-shift, aging with random marks, cycles and final sizes, log-normal
# rounds, churn), object sizes (uniform, fixed, log-normal, bimodal, or a
# mix of two or three of those; random bounds), a probability of freeing, a device of 1 GiB to 1 TiB and a round
# size, and runs to its first failure (or its end). Prints the
# distribution of segfit minus best fit at the first failure, the streams
# furthest below, and the same for pool and groups.
#
#   scripts/stream-family.sh N SEED [BINARY]
#
# The streams depend on N, SEED and MAX_CAPACITY only. JSON records go to $OUT
# (default target/stream-family), one line per engine and stream.
# MAX_CAPACITY (default 1TiB) caps the devices drawn; TIME_LIMIT (default
# 120 s) ends a stream that runs longer (it then counts as unfinished);
# ENGINES (default segfit,pool,groups) lists the engines beside best fit.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
N=$1
SEED=$2
B=${3:-}
OUT=${OUT:-target/stream-family}
MAX_CAPACITY=${MAX_CAPACITY:-1TiB}
TIME_LIMIT=${TIME_LIMIT:-120}
ENGINES=${ENGINES:-segfit,pool,groups}
if [ -z "$B" ]; then
    cargo build --release -q -p blockalloc-cli
    B=${CARGO_TARGET_DIR:-$PWD/target}/release/blockalloc
fi
mkdir -p "$OUT"
runs="$OUT/family-$N-$SEED.jsonl"
: >"$runs"
max_gib=$(python3 -c '
import re, sys
m = re.fullmatch(r"(\d+)(GiB|TiB)", sys.argv[1])
if not m:
    sys.exit("MAX_CAPACITY: give GiB or TiB, e.g. 64GiB")
print(int(m[1]) * (1024 if m[2] == "TiB" else 1))
' "$MAX_CAPACITY")

# One line of bench arguments per stream, drawn from SEED.
python3 - "$N" "$SEED" "$max_gib" >"$OUT/streams-$N-$SEED.txt" <<'EOF'
import math, random, sys
n, seed, max_gib = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
KIB = 1024
def size_text(b):
    return f"{max(1, int(b))}B"
def sizes():
    kind = rng.choice(["uniform", "fixed", "lognormal", "bimodal", "mix"])
    if kind == "bimodal":
        a, b = sorted(rng.sample([4, 8, 16, 64, 128, 512, 1024, 2048, 4096], 2))
        return f"mix:{rng.randint(1, 9)}*fixed:{a * KIB}B+1*fixed:{b * KIB}B"
    if kind == "mix":
        parts = [simple() for _ in range(rng.randint(2, 3))]
        return "mix:" + "+".join(f"{rng.randint(1, 9)}*{p}" for p in parts)
    return simple(kind)
def simple(kind=None):
    kind = kind or rng.choice(["uniform", "fixed", "lognormal"])
    if kind == "uniform":
        lo = rng.choice([1, 4 * KIB, 64 * KIB, 512 * KIB, 2048 * KIB])
        hi = rng.randint(max(lo, 8 * KIB), 4096 * KIB)
        return f"uniform:{size_text(lo)}..{size_text(hi)}"
    if kind == "fixed":
        return f"fixed:{size_text(rng.choice([4, 16, 64, 128, 1024, 3000, 4096]) * KIB)}"
    median = math.exp(rng.uniform(math.log(8 * KIB), math.log(2048 * KIB)))
    return f"lognormal:{size_text(median)}:{rng.uniform(0.2, 2.0):.2f}"
for i in range(n):
    gib = int(math.exp(rng.uniform(0, math.log(max_gib))))
    gib = max(1, min(gib, max_gib))
    # Rounds sized so that the device takes some tens of rounds to fill.
    round_size = max(100, int(gib * rng.uniform(20, 400)))
    workload = rng.choice(["seed", "seed", "shift", "fill-shift", "aging", "aging", "lognormal", "churn"])
    args = [f"--capacity {gib}GiB", f"--round-size {round_size}", f"--seed {rng.randrange(1 << 31)}"]
    if workload == "seed":
        args += [f"--sizes {sizes()}", f"--free-prob {rng.uniform(0.1, 0.9):.2f}"]
    elif workload == "aging":
        high = rng.uniform(0.6, 0.97)
        low = rng.uniform(0.2, high - 0.05)
        args += ["--workload aging", f"--sizes {sizes()}", f"--aging-high {high:.2f}",
                 f"--aging-low {low:.2f}", f"--aging-cycles {rng.randint(1, 6)}",
                 f"--aging-large {sizes()}"]
    elif workload == "lognormal":
        median = math.exp(rng.uniform(math.log(8 * KIB), math.log(1024 * KIB)))
        args += [f"--workload lognormal:{size_text(median)}:{rng.uniform(0.3, 2.0):.2f}",
                 f"--free-prob {rng.uniform(0.1, 0.9):.2f}"]
    elif workload == "churn":
        args += ["--workload churn", f"--sizes {sizes()}",
                 f"--churn-fill {rng.uniform(0.7, 0.98):.2f}", f"--churn-volume {rng.uniform(0.5, 3):.1f}"]
    else:
        args += [f"--workload {workload}"]
    print(" ".join(args))
EOF

i=0
while read -r line; do
    i=$((i + 1))
    echo "== stream $i of $N: $line" >&2
    # shellcheck disable=SC2086 # the line is a list of arguments
    "$B" bench --engine "$ENGINES" --reference best-fit --time-limit "$TIME_LIMIT" \
        --quiet --json - $line |
        python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    r["stream"] = int(sys.argv[1]); r["args"] = sys.argv[2]
    print(json.dumps(r))
' "$i" "$line" >>"$runs"
done <"$OUT/streams-$N-$SEED.txt"

python3 - "$runs" <<'EOF'
import json, sys
by = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    by.setdefault(r["stream"], {})[r["engine"]] = r
def util(r):
    return r.get("utilization_at_first_failure")
print(f"{len(by)} streams; points of utilisation at the first failure against best fit")
print()
print("| engine | streams compared | within 0.01 | median | 1st percentile | worst | below by > 0.1 | below by > 0.3 | above by > 0.1 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
worst = {}
for eng in ["segfit", "pool", "groups"]:
    d = []
    for s, rs in sorted(by.items()):
        if eng in rs and "best-fit" in rs and util(rs[eng]) is not None and util(rs["best-fit"]) is not None:
            d.append((100 * (util(rs[eng]) - util(rs["best-fit"])), s))
    if not d:
        continue
    d.sort()
    worst[eng] = d[:5]
    med = d[len(d) // 2][0]
    p1 = d[len(d) // 100][0]
    print(f"| {eng} | {len(d)} | {sum(abs(x) <= 0.01 for x, _ in d)} | {med:+.3f} | {p1:+.3f} | {d[0][0]:+.3f} | "
          f"{sum(x < -0.1 for x, _ in d)} | {sum(x < -0.3 for x, _ in d)} | {sum(x > 0.1 for x, _ in d)} |")
print()
print("segfit's five streams furthest below best fit:")
print()
print("| points | segfit % | best fit % | stream |")
print("|---:|---:|---:|---|")
for x, s in worst.get("segfit", []):
    rs = by[s]
    print(f"| {x:+.3f} | {100 * util(rs['segfit']):.4f} | {100 * util(rs['best-fit']):.4f} | `{rs['segfit']['args']}` |")
EOF
