package blockalloc

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// tenantServer serves a new device for two tenants, "a" and "b", and
// returns their tokens.
func tenantServer(t *testing.T) (*testServer, string, string) {
	t.Helper()
	dir := t.TempDir()
	ta, tb := "bat_go-test-token-a", "bat_go-test-token-b"
	hash := func(tok string) string {
		h := sha256.Sum256([]byte(tok))
		return hex.EncodeToString(h[:])
	}
	cfg := filepath.Join(dir, "serve.toml")
	text := fmt.Sprintf("[server]\nregion_bytes = 4194304\n\n"+
		"[[tenant]]\nname = \"a\"\ntoken_sha256 = %q\n\n"+
		"[[tenant]]\nname = \"b\"\ntoken_sha256 = %q\n", hash(ta), hash(tb))
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, serverOpts{size: "64MiB", device: filepath.Join(dir, "dev0"), extra: []string{"--config", cfg}})
	return s, ta, tb
}

func dialAs(t *testing.T, s *testServer, token string) *Client {
	t.Helper()
	c, err := Dial(s.addr, Options{MaxReconnectDelay: 200 * time.Millisecond, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func refusedCode(err error) codes.Code {
	var r *RefusedError
	if errors.As(err, &r) {
		return r.Code
	}
	return codes.Unknown
}

func TestTenantsNeedTheirTokenAndKeepToTheirSpace(t *testing.T) {
	s, ta, tb := tenantServer(t)
	ctx := ctxT(t)
	if _, err := dialAs(t, s, "").Status(ctx); refusedCode(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
	if _, err := dialAs(t, s, "bat_wrong").Allocate(ctx, 4096); refusedCode(err) != codes.Unauthenticated {
		t.Fatalf("wrong token: %v", err)
	}
	a, b := dialAs(t, s, ta), dialAs(t, s, tb)
	mine, err := a.Allocate(ctx, 64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Free(ctx, mine); refusedCode(err) != codes.PermissionDenied {
		t.Fatalf("b freed a's extent: %v", err)
	}
	st := devStatus(t, a)
	if len(st.Tenants) != 1 || st.Tenants[0].Name != "a" || st.Tenants[0].UsedBlocks != 64 {
		t.Fatalf("a's status: %v", st.Tenants)
	}
	if n, err := a.Free(ctx, mine); err != nil || n != 64 {
		t.Fatalf("a frees its own: %d %v", n, err)
	}
}
