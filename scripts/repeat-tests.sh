#!/usr/bin/env bash
# Runs the test binaries that start servers, sleep or count under
# concurrency N times in a row, with two busy loops beside them (a loaded
# machine), and reports every failing run. A test that fails even once here
# waits for wall-clock luck instead of an event or a condition.
#
# Usage: scripts/repeat-tests.sh [N] [SUITE...]
#   N       runs of each suite (default 30)
#   SUITE   service:NAME  crates/service/tests/NAME.rs
#           service-lib   the service crate's unit tests
#           cli:NAME      crates/cli/tests/NAME.rs
#           store:NAME    crates/store/tests/NAME.rs
#           client:NAME   crates/client/tests/NAME.rs
#           cluster:NAME  crates/cluster/tests/NAME.rs (a real etcd)
#           go            the Go client's tests (needs go and the
#                         blockalloc binary, built here)
#   Without suites: every one of them listed in DEFAULT_SUITES below.
#
# Environment: BUSY=0 runs without the busy loops; CARGO_FLAGS adds flags
# to the cargo builds (e.g. --release). Logs of failing runs go to
# target/repeat-tests/.
set -u
cd "$(dirname "$0")/.."

DEFAULT_SUITES=(
    service:requests service:leases service:fragments service:leasing
    service:leasing_refusals service:server service:calls
    service:lease_growth service:tenants service:ops service:abuse
    service:stalls service:first_failure service:fuzz service-lib
    client:leasing cli:serve cli:cluster cluster:etcd store:sigkill go
)

n=${1:-30}
shift || true
suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=("${DEFAULT_SUITES[@]}")
logs=target/repeat-tests
mkdir -p "$logs"

# The test binary of one cargo target, built once: its path (not that of
# the binaries the target's tests run).
binary() { # package, cargo target flags...
    local pkg=$1
    shift
    # shellcheck disable=SC2086
    cargo test -p "$pkg" --all-features ${CARGO_FLAGS:-} "$@" --no-run \
        --message-format=json 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m.get("executable"):
        print(m["executable"])' | tail -1
}

profile=debug
case " ${CARGO_FLAGS:-} " in *" --release "*) profile=release ;; esac

busy=()
stop_busy() {
    for p in "${busy[@]}"; do kill "$p" 2>/dev/null; done
}
trap stop_busy EXIT

# Build everything first, unloaded.
declare -A bins
for s in "${suites[@]}"; do
    case $s in
    service:*) bins[$s]=$(binary blockalloc-service --test "${s#service:}") ;;
    service-lib) bins[$s]=$(binary blockalloc-service --lib) ;;
    cli:*) bins[$s]=$(binary blockalloc-cli --test "${s#cli:}") ;;
    store:*) bins[$s]=$(binary blockalloc-store --test "${s#store:}") ;;
    client:*) bins[$s]=$(binary blockalloc-client --test "${s#client:}") ;;
    cluster:*) bins[$s]=$(binary blockalloc-cluster --test "${s#cluster:}") ;;
    go)
        # shellcheck disable=SC2086
        cargo build -p blockalloc-cli ${CARGO_FLAGS:-} 2>/dev/null
        (cd clients/go && go test -c -o ../../"$logs"/go.test .) && bins[$s]=$logs/go.test
        ;;
    *) echo "unknown suite $s" >&2 && exit 2 ;;
    esac
    if [ -z "${bins[$s]:-}" ]; then
        echo "$s: could not build its tests" >&2
        exit 2
    fi
done

if [ "${BUSY:-1}" != 0 ]; then
    for _ in 1 2; do
        sh -c 'while :; do :; done' &
        busy+=($!)
    done
fi

bad=0
for s in "${suites[@]}"; do
    fails=0
    for i in $(seq "$n"); do
        log=$logs/${s//[:\/]/-}.$i.log
        case $s in
        go)
            (cd clients/go &&
                BLOCKALLOC_BIN=$PWD/../../target/$profile/blockalloc \
                    ../../"${bins[$s]}" -test.count=1) >"$log" 2>&1
            ;;
        *) "${bins[$s]}" >"$log" 2>&1 ;;
        esac
        if [ $? -eq 0 ]; then
            rm -f "$log"
        else
            fails=$((fails + 1))
            echo "$s: run $i failed ($log):"
            grep -E "^test .* FAILED|panicked at|^--- FAIL" "$log" | head -5 | sed 's/^/    /'
        fi
    done
    echo "$s: $fails of $n runs failed"
    [ "$fails" -eq 0 ] || bad=1
done
exit $bad
