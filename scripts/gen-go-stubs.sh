#!/usr/bin/env bash
# Generates the Go stubs of the allocation service (package blockallocv1 of
# the Go client) from crates/proto/proto/blockalloc/v1/allocator.proto.
#
#   scripts/gen-go-stubs.sh            writes clients/go/blockallocv1/
#   scripts/gen-go-stubs.sh OUT_DIR    writes OUT_DIR/ instead (CI compares
#                                      it with the committed stubs)
#
# The generators are pinned, so the output is byte for byte the same on
# every machine with the same protoc: protoc from Debian's
# protobuf-compiler, protoc-gen-go and protoc-gen-go-grpc installed with
# `go install` into a tool directory of their own (GOBIN below).
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
MODULE=github.com/blockalloc/blockalloc/clients/go
PKG=blockallocv1

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/clients/go/$PKG}
tools=${BLOCKALLOC_GO_TOOLS:-$root/clients/go/.tools}

if ! command -v protoc >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null
    else
        echo "gen-go-stubs: protoc is missing; install Debian's protobuf-compiler" >&2
        exit 1
    fi
fi

mkdir -p "$tools"
if ! [ -x "$tools/protoc-gen-go" ] ||
    [ "$("$tools/protoc-gen-go" --version)" != "protoc-gen-go $PROTOC_GEN_GO_VERSION" ]; then
    GOBIN=$tools go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
fi
if ! [ -x "$tools/protoc-gen-go-grpc" ] ||
    [ "$("$tools/protoc-gen-go-grpc" --version)" != "protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION#v}" ]; then
    GOBIN=$tools go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"
fi

# The schema has no go_package option (it is shared with the Rust server),
# so the Go import path is given here.
proto=blockalloc/v1/allocator.proto
map="M$proto=$MODULE/$PKG;$PKG"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PATH=$tools:$PATH protoc -I "$root/crates/proto/proto" \
    --go_out="$tmp" --go_opt="$map" --go_opt=paths=import \
    --go-grpc_out="$tmp" --go-grpc_opt="$map" --go-grpc_opt=paths=import \
    "$proto"
mkdir -p "$out"
cp "$tmp/$MODULE/$PKG/"*.go "$out/"
