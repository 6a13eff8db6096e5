package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const (
	oauthResourceB = "https://gw2.greenhouse.example/mcp"
	oauthSite      = "https://greenhouse.example/mcp" // examples/oauth's site_resource
)

// oauthMeshPolicy is examples/oauth's identity for one gateway (its
// resource, the site's, the issuer) with the static admin token the
// harness reads the simulator with.
const oauthMeshPolicy = `physmcp_policy_version: "0.1"
identity:
  oauth:
    resource: %s
    site_resource: %s
    authorization_servers:
      - issuer: %s
    algorithms: [RS256]
    scopes:
      physd:read: viewer
      physd:operate: operator
  tokens:
    - {id: site_admin, sha256: b52aa8aa128a1e000ac3c35f0b7b16dee3a2baa5950139e03447d04d7689ea0f, role: admin}
`

const oauthMeshFan = `capabilities:
  do_fan_zone_b:
    rules:
      - {type: permission, require: [operator]}
gate:
  fail_closed: deny
  l0:
    allow:
      - {name: fan, tool: do_fan_zone_b}
`

var seedPeers = regexp.MustCompile(`seed_peers: \[[^\]]*\]`)

// TestOAuthMeshRoutedCaller: two gateways of one site, each an OAuth
// resource server of the same zitadel OP with its own resource and the
// shared site_resource. A token for the site, presented to A, follows a
// read_ and a do_ routed to B's fan, and B authenticates it itself (its
// audit names the OAuth subject, via gw_zone_a); a token for A's own
// resource is good at A but counts for nothing at B (B's operator-only fan
// refuses it, unwritten). Own loopback addresses (127.0.0.22-23) keep it
// apart from the other mesh tests.
func TestOAuthMeshRoutedCaller(t *testing.T) {
	t.Parallel()
	as := startAS(t)
	dir := t.TempDir()
	const ipA, ipB = "127.0.0.22", "127.0.0.23"
	gateway := func(n, ip, peer, peerIP, resource string) *daemon {
		mb, err := os.ReadFile(repoPath("examples/mesh-3node/node_" + n + ".yml"))
		if err != nil {
			t.Fatal(err)
		}
		m := strings.NewReplacer("127.0.0.2", ipA, "127.0.0.3", ipB).Replace(string(mb))
		m = seedPeers.ReplaceAllString(m, "seed_peers: ["+peer+"/"+peerIP+":7946]")
		m = strings.Replace(m, "expected_size: 3", "expected_size: 2", 1)
		man := filepath.Join(dir, "node_"+n+".yml")
		os.WriteFile(man, []byte(m), 0o600)
		p := fmt.Sprintf(oauthMeshPolicy, resource, oauthSite, as.issuer)
		if n == "b" {
			// B's fan is for operators only: an unauthenticated routed
			// call must not run it.
			p += oauthMeshFan
		}
		pol := filepath.Join(dir, n+".policy.yml")
		os.WriteFile(pol, []byte(p), 0o600)
		state := filepath.Join(dir, n)
		args := []string{"run", "--manifest", man, "--state", state, "--http", ip + ":0", "--sim-control", "--policy", pol}
		d := &daemon{cmd: exec.Command(physdBin, args...), state: state, stderr: &syncBuffer{}, done: make(chan error, 1), token: adminDemoToken}
		d.cmd.Stderr = d.stderr
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { d.done <- d.cmd.Wait() }()
		t.Cleanup(func() { d.stop(t) })
		d.addr = d.stderr.logValue(t, "listening", "addr")
		d.stderr.logValue(t, "mesh joined", "node")
		return d
	}
	a := gateway("a", ipA, "gw_zone_b", ipB, oauthResource)
	b := gateway("b", ipB, "gw_zone_a", ipA, oauthResourceB)

	// call runs tool at A routed to B, waiting for B's catalog to arrive.
	call := func(token, tool string, args map[string]any) (*mcp.CallToolResult, error) {
		cs := connectAs(t, a, protocol2026, token, nil)
		deadline := time.Now().Add(20 * time.Second)
		for {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
			msg := ""
			if err != nil {
				msg = err.Error()
			} else if res.IsError {
				msg = text(res)
			}
			if !strings.Contains(msg, "unknown") || time.Now().After(deadline) {
				return res, err
			}
			time.Sleep(200 * time.Millisecond) // catalogs spread by gossip
		}
	}
	siteTok := as.clientCredentials(t, oauthSite, oauthReadScope, oauthOperScope)
	aTok := as.clientCredentials(t, oauthResource, oauthReadScope, oauthOperScope)

	if res, err := call(siteTok, "read_humidity_zone_b", map[string]any{"source": "gw_zone_b"}); err != nil || res.IsError {
		t.Fatalf("a routed read_ with the site's token: %v %s", err, text(res))
	}
	do := func(token string, value int, key string) hAnswer {
		res, err := call(token, "do_fan_zone_b", map[string]any{"value": value, "idempotency_key": key, "source": "gw_zone_b"})
		return decodeDo(t, res, err)
	}
	if ans := do(siteTok, 40, "oauth-mesh-site"); ans.Status != "success" {
		t.Fatalf("a routed do_ with the site's token: %s %s", ans.raw, ans.toolErr)
	}
	// A's own token: A accepts it (a local read), B does not.
	if res, err := call(aTok, "read_temperature_zone_a", map[string]any{}); err != nil || res.IsError {
		t.Fatalf("A's token at A: %v %s", err, text(res))
	}
	if ans := do(aTok, 30, "oauth-mesh-a"); ans.Status == "success" || ans.Status == "partial" {
		t.Errorf("B ran its operator-only fan for a token of A's resource: %s", ans.raw)
	} else {
		t.Logf("A's token routed to B: %s %s", ans.raw, ans.toolErr)
	}
	if w := b.sim(t).writes("zone_b.fan"); w != 1 {
		t.Errorf("B's fan written %d times, want 1 (the site token's)", w)
	}
	subject := `"caller":"oauth:` + as.issuer + `/` + serviceClient + `"`
	trail, _ := os.ReadFile(filepath.Join(b.state, "audit", "audit.jsonl"))
	found, refused := false, false
	for _, l := range strings.Split(string(trail), "\n") {
		if strings.Contains(l, `"event":"do"`) && strings.Contains(l, "oauth-mesh-site") {
			found = true
			if !strings.Contains(l, subject) || !strings.Contains(l, `"via":"gw_zone_a"`) {
				t.Errorf("B's audit of the routed do_ does not name the OAuth subject via A: %s", l)
			}
		}
		if strings.Contains(l, "oauth-mesh-a") {
			if strings.Contains(l, subject) {
				t.Errorf("B audited A's token as the OAuth subject: %s", l)
			}
			refused = refused || strings.Contains(l, `"event":"do_refused"`) && strings.Contains(l, `"caller":"unauthenticated (the access token is not accepted here)"`)
		}
	}
	if !found || !refused {
		t.Errorf("B's audit lacks the site token's do (%v) or the refusal of A's token as unauthenticated (%v):\n%s", found, refused, trail)
	}
}
