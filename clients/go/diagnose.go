package blockalloc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"
)

// h2Preface is what an HTTP/2 client sends first: the preface and an empty
// SETTINGS frame. An HTTP/2 server answers it with its own SETTINGS.
var h2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")

// remoteAlert is how crypto/tls words an alert received from the peer
// (its error type for it is not exported).
const remoteAlert = "remote error: tls: "

// The alerts a server refuses a client certificate with, as crypto/tls
// words them.
var refusedCertificate = []string{
	"bad certificate", "unknown certificate", "unknown certificate authority", "access denied",
}

// explain returns err, or, when the connection failed because of a TLS
// mistake of the client's settings, an error (still ErrUnavailable) that
// says what is wrong and how to fix it: plain text to a server that serves
// TLS (it answers a TLS hello), or no or a refused client certificate for
// a server that demands one (its alert, asked on a connection of its own).
// Only failures of the connection are looked into, not the server's
// refusals, and not a caller's ended context.
func (c *Client) explain(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil || !errors.Is(err, ErrUnavailable) || !connectionFailed(err) {
		return err
	}
	pctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if c.tls == nil {
		if servesTLS(pctx, c.addr) {
			return fmt.Errorf("%w: the server at %s serves TLS and this client connects in plain text: "+
				"set Options.TLS (with RootCAs holding the CA that signed the server's certificate "+
				"if no public root does)", ErrUnavailable, c.addr)
		}
		return err
	}
	alert := peerAlert(err)
	if alert == "" {
		alert = peerAlert(tlsProbe(pctx, c.addr, c.tls))
	}
	switch {
	case alert == "certificate required":
		return fmt.Errorf("%w: the server at %s requires a client certificate (mutual TLS) and this "+
			"client presented none: set Options.TLS.Certificates to a certificate and key signed by "+
			"the CA the server trusts for clients", ErrUnavailable, c.addr)
	case slices.Contains(refusedCertificate, alert):
		return fmt.Errorf("%w: the server at %s refused this client's certificate (mutual TLS: %s): "+
			"use one signed by the CA the server trusts for clients", ErrUnavailable, c.addr, alert)
	}
	return err
}

// connectionFailed reports whether err words a failure of the connection
// (gRPC's "connection error", or the socket's), not a refusal the server
// sent: those are not worth a probe.
func connectionFailed(err error) bool {
	m := err.Error()
	for _, w := range []string{"connection error", "broken pipe", "connection reset", "EOF", remoteAlert} {
		if strings.Contains(m, w) {
			return true
		}
	}
	return false
}

// peerAlert is the TLS alert the peer sent, as err words it, or "".
func peerAlert(err error) string {
	if err == nil {
		return ""
	}
	m := err.Error()
	i := strings.Index(m, remoteAlert)
	if i < 0 {
		return ""
	}
	a := m[i+len(remoteAlert):]
	if j := strings.IndexAny(a, "\"\n"); j >= 0 {
		a = a[:j]
	}
	return a
}

// servesTLS reports whether the server at addr completes or refuses a TLS
// handshake with a TLS record, which a plain-text HTTP/2 server never does
// (its first bytes do not look like one). The handshake only asks whether
// the server speaks TLS: nothing is sent over it, so its certificate is
// not checked.
func servesTLS(ctx context.Context, addr string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	host, _, _ := net.SplitHostPort(addr)
	tc := tls.Client(conn, &tls.Config{ServerName: host, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // probe only
	err = tc.HandshakeContext(ctx)
	return err == nil || peerAlert(err) != ""
}

// tlsProbe connects to addr with cfg (HTTP/2 over TLS, as gRPC does), sends
// the HTTP/2 preface and reads: the error of the first step that fails. In
// TLS 1.3 a server checks the client's certificate after the handshake, so
// its alert comes with the first read.
func tlsProbe(ctx context.Context, addr string, cfg *tls.Config) error {
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	cfg.NextProtos = []string{"h2"}
	d := tls.Dialer{Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write(h2Preface); err != nil {
		return err
	}
	_, err = conn.Read(make([]byte, 1))
	return err
}
