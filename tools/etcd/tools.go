//go:build tools

// Package tools pins the etcd server that the cluster tests run: `go build
// -o ../../target/etcd/etcd go.etcd.io/etcd/server/v3` in this directory
// builds it from the Go module proxy (the tests do this themselves when no
// etcd is given; see crates/cluster/src/testkit.rs).
package tools

import _ "go.etcd.io/etcd/server/v3"
