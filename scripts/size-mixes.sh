#!/usr/bin/env bash
# segfit beside a plain best fit over many streams: the utilisation at the
# first failure of each, stream by stream, then a summary.
#
#   scripts/size-mixes.sh [LIST] [BINARY]
#
# LIST (default scripts/size-mixes.txt) holds `blockalloc bench` arguments,
# one stream per line ('#' starts a comment). BINARY defaults to a fresh
# release build; give another build's binary to compare two versions.
set -euo pipefail
cd "$(dirname "$0")/.."
LIST=${1:-scripts/size-mixes.txt}
B=${2:-}
if [ -z "$B" ]; then
    cargo build --release -q -p blockalloc-cli
    B=${CARGO_TARGET_DIR:-$PWD/target}/release/blockalloc
fi
grep -v '^#' "$LIST" | grep -v '^[[:space:]]*$' | while read -r line; do
    # shellcheck disable=SC2086 # the line is a list of arguments
    "$B" bench --engine segfit --reference best-fit --time-limit 60 --quiet --json - $line |
        python3 -c '
import json, sys
u = {}
for l in sys.stdin:
    r = json.loads(l)
    u[r["engine"]] = r["utilization_at_first_failure"]
def pct(x):
    return "end" if x is None else "%.4f" % (100 * x)
print("%s\t%s\t%s" % (sys.argv[1], pct(u.get("segfit")), pct(u.get("best-fit"))))
' "$line"
done | python3 -c '
import sys
rows = [l.rstrip("\n").split("\t") for l in sys.stdin]
print("stream\tsegfit %\tbest fit %")
for r in rows:
    print("\t".join(r))
both = [(float(s), float(b)) for _, s, b in rows if s != "end" and b != "end"]
below = sum(1 for s, b in both if s < b - 0.01)
far = sum(1 for s, b in both if s < b - 0.1)
mean = sum(s - b for s, b in both) / max(1, len(both))
print("%d streams failed under both: segfit - best fit %+.3f points on average; "
      "below best fit in %d (by more than 0.1 points in %d)" % (len(both), mean, below, far))
'
