#!/usr/bin/env bash
# CI of the Go client: stubs up to date, gofmt, go vet, go test (against a
# real server binary), the race detector on the concurrency tests (the
# background goroutines: commits, renewals, lease growth, the recall
# watcher), and `go get` of the module from a fresh module outside the
# repository (install-check.sh).
#
#   BLOCKALLOC_BIN   the server binary (default debug/blockalloc in Cargo's
#                    target directory: $CARGO_TARGET_DIR, else the
#                    workspace's target/; build it first with
#                    `cargo build -p blockalloc-cli`)
#
# Installs what it needs (protoc from Debian's protobuf-compiler, the pinned
# protoc plugins, the Go modules) and does nothing when they are there.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$here"

# Cargo's target directory, as `cargo build` used it (CARGO_TARGET_DIR
# when set), so that a stale binary in target/ is never the one tested.
target=${CARGO_TARGET_DIR:-$here/../../target}
case "$target" in /*) ;; *) target=$root/$target ;; esac
export BLOCKALLOC_BIN=${BLOCKALLOC_BIN:-$target/debug/blockalloc}
if ! [ -x "$BLOCKALLOC_BIN" ]; then
    echo "ci.sh: no server binary at $BLOCKALLOC_BIN (cargo build -p blockalloc-cli, or set BLOCKALLOC_BIN)" >&2
    exit 1
fi
command -v go >/dev/null || { echo "ci.sh: go is not installed" >&2; exit 1; }

echo "== go: module download"
go mod download

echo "== go: generated stubs match crates/proto/proto/blockalloc/v1/allocator.proto"
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
"$root/scripts/gen-go-stubs.sh" "$gen"
if ! diff -r "$gen" "$here/blockallocv1"; then
    echo "ci.sh: clients/go/blockallocv1 is stale: run scripts/gen-go-stubs.sh and commit the result" >&2
    exit 1
fi

echo "== go: gofmt"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
    echo "ci.sh: not gofmt-formatted:" >&2
    echo "$unformatted" >&2
    exit 1
fi

echo "== go: vet"
go vet ./...

echo "== go: test"
go test -count=1 ./...

echo "== go: test -race (concurrency)"
go test -count=1 -race -run 'Concurrent|Call|ErrorsAreTyped|LocalAlloc|Restart|Expiry|Grows|Extends|Spanning|Resen|Batches|Recall|Deadline|Epoch|Stale|RequestID|Cluster' ./...

echo "== go: go get from outside the repository"
bash "$here/install-check.sh"
