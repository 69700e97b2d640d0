package blockalloc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfSignedTLS writes a self-signed certificate for 127.0.0.1 and its key
// into dir, and returns their paths and a pool that trusts it.
func selfSignedTLS(t *testing.T, dir string) (string, string, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "blockalloc test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath := filepath.Join(dir, "server.pem")
	keyPath := filepath.Join(dir, "server.key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return certPath, keyPath, pool
}

func TestDialWithTLSReachesATLSServerAndPlainTextDoesNot(t *testing.T) {
	certPath, keyPath, pool := selfSignedTLS(t, t.TempDir())
	srv := startServer(t, serverOpts{
		size:  "64MiB",
		extra: []string{"--tls-cert", certPath, "--tls-key", keyPath, "--require-tls"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c, err := Dial(srv.addr, Options{TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatalf("status over TLS: %v", err)
	}
	if st.Name != "dev0" {
		t.Fatalf("unexpected status %v", st)
	}

	plain, err := Dial(srv.addr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	_, err = plain.Status(short)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("plain text against a TLS server: got %v, want ErrUnavailable", err)
	}
	// The error says what is wrong and what to set.
	if m := err.Error(); !strings.Contains(m, "serves TLS") || !strings.Contains(m, "Options.TLS") {
		t.Fatalf("plain text against a TLS server: %q does not name the cause and the fix", m)
	}
}

func TestAMutualTLSServerWithoutAClientCertificateSaysToGiveOne(t *testing.T) {
	certPath, keyPath, pool := selfSignedTLS(t, t.TempDir())
	srv := startServer(t, serverOpts{
		size:  "64MiB",
		extra: []string{"--tls-cert", certPath, "--tls-key", keyPath, "--tls-client-ca", certPath},
	})
	c, err := Dial(srv.addr, Options{TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for what, call := range map[string]func() error{
		"status":   func() error { _, err := c.Status(ctx); return err },
		"allocate": func() error { _, err := c.Allocate(ctx, 8); return err },
	} {
		err := call()
		if m := fmt.Sprint(err); !errors.Is(err, ErrUnavailable) ||
			!strings.Contains(m, "requires a client certificate") || !strings.Contains(m, "Options.TLS.Certificates") {
			t.Fatalf("%s without a client certificate: %v", what, err)
		}
	}
}
