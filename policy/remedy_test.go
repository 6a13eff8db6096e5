package policy_test

import (
	"context"
	"strings"
	"testing"

	"github.com/physd/physd/policy"
	"github.com/physd/physd/promcp"
)

// TestRoleRefusalNamesTheTransportsRemedy: the refusal of a caller below
// the tool's role says how a caller on that transport carries a role, and
// not another transport's way (stdio has no token; a routed call's token
// is checked by the owner; only HTTPS carries client certificates).
func TestRoleRefusalNamesTheTransportsRemedy(t *testing.T) {
	_, p := load(t, pol)
	noon := ams(t, "2026-06-10 12:00")
	for transport, c := range map[string]struct{ want, not string }{
		"stdio": {"--stdio-role operator", "token"},
		"http":  {"bearer token or JWT", "--stdio-role"},
		"https": {"client certificate", "--stdio-role"},
		"mesh":  {"forwards the token with the routed call", "have the MCP client start"},
		"":      {"over stdio physd's --stdio-role", "forwards"},
	} {
		o := p.Evaluate(context.Background(), policy.Check{Tool: "do_heater", Value: 50.0, Role: "none", Transport: transport, Now: noon}, nil, nil)
		if o.Permission != promcp.PermPermissionInsufficient {
			t.Fatalf("%q: %+v; want permission_insufficient (the test proves nothing)", transport, o)
		}
		if !strings.Contains(o.Reason, c.want) || strings.Contains(o.Reason, c.not) {
			t.Errorf("transport %q: %q; want %q and no %q", transport, o.Reason, c.want, c.not)
		}
	}
}
