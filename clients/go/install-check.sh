#!/usr/bin/env bash
# Installs the Go client as a user would: `go get
# github.com/blockalloc/blockalloc/clients/go@vVERSION` in a fresh module
# outside the repository, then builds, vets and runs a small program that
# imports it and allocates and frees once on a real server.
#
# The module is served from a module proxy made here (GOPROXY=file://...)
# holding the work tree's files as version v$Version, where Version is the
# const in version.go (checked against Cargo.toml's workspace version). Not
# a `replace` directive: that reads the directory as it is and skips what a
# user's `go get` goes through, which is what this checks: the module path
# in go.mod against the import paths, the version's form (a vX.Y.Z tag of a
# module below v2), the zip the proxy serves (no file of a nested module,
# nothing .gitignore leaves out, the go command's size and name rules), and
# the dependencies resolved from the module's own go.mod.
#
#   BLOCKALLOC_BIN   the server binary (ci.sh sets it); without it the
#                    program is built and vetted but not run
#
# Dependencies come from the local module cache when they are there, then
# from the default proxy (go env GOPROXY); the checksum database is asked
# about them but not about this module (GONOSUMDB), which it cannot know
# before the tag is public.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
module=github.com/blockalloc/blockalloc/clients/go
export GOTOOLCHAIN=local GOWORK=off

# The one place the version is stated: version.go; the Rust workspace's
# version must be the same (the stubs are its schema's).
version=$(sed -n 's/^const Version = "\(.*\)"$/\1/p' "$here/version.go")
cargo_version=$(awk '/^\[workspace.package\]/ { p = 1; next } /^\[/ { p = 0 } p && /^version *=/ { gsub(/[" ]/, "", $0); sub(/^version=/, "", $0); print; exit }' "$root/Cargo.toml")
if [ -z "$version" ] || [ "$version" != "$cargo_version" ]; then
    echo "install-check: version.go says Version = \"$version\", Cargo.toml's workspace version is \"$cargo_version\": they must be the same" >&2
    exit 1
fi
tag=v$version

work=$(mktemp -d)
server_pid=
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "== go: module proxy with $module@$tag (clients/go/$tag once tagged)"
(cd "$here/tools/modproxy" && go vet ./... && go build -o "$work/modproxy" .)
"$work/modproxy" -dir "$here" -version "$tag" -out "$work/proxy"

# A module cache of its own, so that no earlier run's copy of $tag is
# used; -modcacherw lets the cleanup remove it.
default_proxy=$(go env GOPROXY)
export GOMODCACHE=$work/modcache
export GOPROXY="file://$work/proxy,file://$(go env GOPATH | cut -d: -f1)/pkg/mod/cache/download,$default_proxy"
export GONOSUMDB=github.com/blockalloc
export GOFLAGS="${GOFLAGS:-} -modcacherw"

echo "== go: go get $module@$tag in a fresh module"
mkdir "$work/app"
cd "$work/app"
go mod init example.com/blockalloc-install-check >/dev/null 2>&1
cat >main.go <<'EOF'
// Allocates one extent on the server at os.Args[1] and frees it, with the
// client a user gets from `go get`.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	blockalloc "github.com/blockalloc/blockalloc/clients/go"
	"github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatalf("usage: %s ADDR", os.Args[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := blockalloc.Dial(os.Args[1], blockalloc.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	e, err := c.Allocate(ctx, 16)
	if err != nil {
		log.Fatal(err)
	}
	freed, err := c.Free(ctx, e)
	if err != nil {
		log.Fatal(err)
	}
	var _ *blockallocv1.NoSpaceDetails // the stubs' package resolves too
	fmt.Printf("client %s: allocated %v, freed %d blocks\n", blockalloc.Version, e, freed)
}
EOF
go get "$module@$tag"
got=$(go list -m -f '{{.Version}}' "$module")
if [ "$got" != "$tag" ]; then
    echo "install-check: the fresh module has $module $got, not $tag" >&2
    exit 1
fi
go vet ./...
go build -o app .

if [ -z "${BLOCKALLOC_BIN:-}" ]; then
    echo "install-check: built; not run (no BLOCKALLOC_BIN)"
    exit 0
fi
echo "== go: the installed client against $BLOCKALLOC_BIN"
"$BLOCKALLOC_BIN" serve --device "$work/dev0" --format 64MiB --listen 127.0.0.1:0 \
    >"$work/server.out" 2>"$work/server.err" &
server_pid=$!
addr=
for _ in $(seq 600); do
    addr=$(sed -n 's/^listening on //p' "$work/server.out" | head -n 1)
    [ -n "$addr" ] && break
    if ! kill -0 "$server_pid" 2>/dev/null; then
        break
    fi
    sleep 0.1
done
if [ -z "$addr" ]; then
    echo "install-check: the server did not print its address:" >&2
    cat "$work/server.err" >&2
    exit 1
fi
./app "$addr"
