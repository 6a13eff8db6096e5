package e2e

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOAuthTSClient: the TypeScript MCP SDK v2's own OAuth client
// (@modelcontextprotocol/client 2.4.0, ClientCredentialsProvider) against
// physd behind the zitadel OP: given only physd's URL and client
// credentials, it discovers the AS from physd's 401 and RFC 9728
// metadata, gets a client_credentials token for the resource, and calls a
// read_, can_do and a do_ (conformance/ts-client/oauth.mjs). It needs
// conformance/node_modules (conformance/run.sh installs it with npm ci;
// run.sh ts runs this test); without it the test is skipped.
func TestOAuthTSClient(t *testing.T) {
	t.Parallel()
	node := repoPath("conformance/node_modules/.bin/node")
	if _, err := os.Stat(node); err != nil {
		if os.Getenv("PHYSD_REQUIRE_TS") != "" {
			t.Fatalf("no Node 22 at %s: run `npm ci` in conformance/", node)
		}
		t.Skipf("no %s (npm ci in conformance/ installs it)", node)
	}
	as := startAS(t)
	// The SDK checks that the metadata's resource is the URL it connects
	// to, so the resource is physd's real address: a port chosen first.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	resource := "http://" + addr + "/mcp"
	p := oauthPolicy(t, as.issuer)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "resource: "+oauthResource) {
		t.Fatalf("examples/oauth/physmcp.policy.yml no longer has resource %s", oauthResource)
	}
	os.WriteFile(p, []byte(strings.Replace(string(b), "resource: "+oauthResource, "resource: "+resource, 1)), 0o600)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", p, "--http", addr}})
	if d.addr != addr {
		t.Fatalf("physd listens on %s, not %s", d.addr, addr)
	}

	cmd := exec.Command(node, repoPath("conformance/ts-client/oauth.mjs"))
	cmd.Dir = repoPath("conformance")
	cmd.Env = append(os.Environ(), "PHYSD_MCP_URL="+resource, "OAUTH_ISSUER="+as.issuer,
		"OAUTH_CLIENT_ID="+serviceClient, "OAUTH_CLIENT_SECRET="+serviceSecret, "OAUTH_SCOPE="+oauthReadScope)
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("oauth.mjs did not finish in 60 s:\n%s", out)
	}
	t.Logf("oauth.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("oauth.mjs: %v", err)
	}
	for _, s := range []string{"connect", "read_temperature_zone_a", "can_do", "do_heater_zone_c", "stepped up"} {
		if !strings.Contains(string(out), `{"step":"`+s+`","ok":true`) {
			t.Errorf("no successful %s step", s)
		}
	}
	trail, _ := os.ReadFile(filepath.Join(d.state, "audit", "audit.jsonl"))
	if !strings.Contains(string(trail), `"caller":"oauth:`+as.issuer+`/`+serviceClient+`"`) {
		t.Errorf("the do_ audit does not name the OAuth client:\n%s", trail)
	}
}
