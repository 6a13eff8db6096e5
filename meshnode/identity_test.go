package meshnode_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/store"
)

// owner is the greenhouse gateway with the manifest-only guard (the zone A
// heater needs the operator role, from its manifest), serving the mesh
// handler as the owner of routed calls. The authenticator knows one
// credential.
func owner(t *testing.T) (handle func(from, kind string, payload any) []byte, auditFile string, heaterWrites func() int) {
	t.Helper()
	m, err := manifest.Load("../examples/greenhouse/physmcp.manifest.yml")
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.ManifestOnly(m)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(dir, "audit"))
	if err != nil {
		t.Fatal(err)
	}
	gd := guard.New(guard.Config{Policy: pol, State: st, DeviceID: m.Device.ID})
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al, Guard: gd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(context.Background()); al.Close(); st.Close() })
	authn := func(cred string) (node.Caller, error) {
		if cred == "operator-token" {
			return node.Caller{ID: "operator_console", Role: "operator", Transport: "http"}, nil
		}
		return node.Caller{}, errors.New("the bearer token is not accepted here")
	}
	h := meshnode.Handler(n, authn)
	handle = func(from, kind string, payload any) []byte {
		b, _ := json.Marshal(payload)
		out, err := h(context.Background(), from, kind, b)
		if err != nil {
			t.Fatalf("%s from %s: %v", kind, from, err)
		}
		return out
	}
	heaterWrites = func() int {
		return int(n.Buses()["plant"].(*sim.Plant).Stats().Points["zone_a.heater"].Writes)
	}
	return handle, filepath.Join(dir, "audit", "audit.jsonl"), heaterWrites
}

// TestOwnerAuthenticatesRoutedCaller: the owner of a routed do_ decides
// who is calling from the credential the caller presented, never from the
// role the routing gateway wrote; its audit names the caller and the
// gateway the call came through.
func TestOwnerAuthenticatesRoutedCaller(t *testing.T) {
	handle, auditFile, writes := owner(t)
	heat := func(key string) map[string]any {
		return map[string]any{"tool": "do_heater_zone_a", "value": 20, "idempotency_key": key}
	}

	// A gateway forges an admin caller and sends no credential.
	forged := heat("forged-1")
	forged["caller"] = map[string]any{"id": "site_admin", "role": "admin", "transport": "http"}
	var ans map[string]any
	json.Unmarshal(handle("gw_evil", meshnode.KindDo, forged), &ans)
	if ans["status"] != "failed" || ans["permission"] != "permission_insufficient" {
		t.Errorf("a forged admin role was taken: %v", ans)
	}
	// A credential this owner does not accept is no better.
	bad := heat("forged-2")
	bad["caller"], bad["credential"] = map[string]any{"id": "site_admin", "role": "admin"}, "guessed"
	json.Unmarshal(handle("gw_evil", meshnode.KindDo, bad), &ans)
	if ans["status"] != "failed" || ans["permission"] != "permission_insufficient" {
		t.Errorf("an unaccepted credential was taken: %v", ans)
	}
	if w := writes(); w != 0 {
		t.Fatalf("the heater was written %d times by forged calls", w)
	}

	// The real operator's credential, routed through gw_front.
	good := heat("routed-1")
	good["caller"], good["credential"] = map[string]any{"id": "whoever", "role": "none"}, "operator-token"
	json.Unmarshal(handle("gw_front", meshnode.KindDo, good), &ans)
	if ans["status"] != "success" {
		t.Errorf("the operator's routed call: %v", ans)
	}

	b, err := os.ReadFile(auditFile)
	if err != nil {
		t.Fatal(err)
	}
	var sawForged, sawReal bool
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			Caller string         `json:"caller"`
			Key    string         `json:"idempotency_key"`
			Status string         `json:"status"`
			Data   map[string]any `json:"data"`
		}
		json.Unmarshal([]byte(line), &r)
		switch r.Key {
		case "forged-1":
			sawForged = r.Caller == "anonymous" && r.Data["via"] == "gw_evil" && r.Status == "failed"
		case "routed-1":
			sawReal = r.Caller == "operator_console" && r.Data["via"] == "gw_front" && r.Status == "success"
		}
	}
	if !sawForged || !sawReal {
		t.Errorf("audit: forged call recorded as anonymous via gw_evil: %v; routed call as operator_console via gw_front: %v\n%s", sawForged, sawReal, b)
	}
}
