// Package testrig opens a node the way package daemon wires one, for tests
// of the packages above node (mcpserver, web): the manifest on the
// simulator, the ledger and audit in a temporary directory, and with a
// policy the guard (policy and phocinae gate) and the approval authority.
// Each test package used to write this sequence out itself.
package testrig

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/store"
)

// Greenhouse is the path of a file of examples/greenhouse.
func Greenhouse(name string) string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..", "examples", "greenhouse", name)
}

// Rig is an open node and what it was opened with.
type Rig struct {
	Manifest *manifest.Manifest
	Node     *node.Node
	Store    *store.Store
	Audit    *audit.Log
	// AuditFile is the audit trail's current file (audit.jsonl).
	AuditFile string
	// Guard is the policy and gate in force; nil without a policy.
	Guard *guard.Guard
	// Plant is the simulator bus "plant", when the manifest has one.
	Plant *sim.Plant
}

// Open opens the manifest at manifestPath under policyText ("" runs
// without a policy), closing everything when the test ends. edit, when
// set, changes the node's configuration before it opens.
func Open(t testing.TB, manifestPath, policyText string, edit func(*node.Config)) *Rig {
	t.Helper()
	m, err := manifest.Load(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	return OpenManifest(t, m, policyText, edit)
}

// OpenManifest is Open for a manifest already parsed.
func OpenManifest(t testing.TB, m *manifest.Manifest, policyText string, edit func(*node.Config)) *Rig {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(dir, "audit"))
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	r := &Rig{Manifest: m, Store: st, Audit: al, AuditFile: filepath.Join(dir, "audit", "audit.jsonl")}
	cfg := node.Config{Manifest: m, Store: st, Audit: al}
	if policyText != "" {
		r.Guard = NewGuard(t, m, st, policyText)
		ap, err := approval.New(approval.Config{Nonces: Nonces{st}, Same: r.Guard.SamePerson, Installation: "test"})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Guard, cfg.Approvals = r.Guard, ap
	}
	if edit != nil {
		edit(&cfg)
	}
	if r.Node, err = node.Open(context.Background(), cfg); err != nil {
		al.Close()
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Node.Close(context.Background())
		al.Close()
		st.Close()
	})
	r.Plant, _ = r.Node.Buses()["plant"].(*sim.Plant)
	return r
}

// NewGuard parses policyText against m and builds its guard and gate.
func NewGuard(t testing.TB, m *manifest.Manifest, st *store.Store, policyText string) *guard.Guard {
	t.Helper()
	pol, err := policy.Parse("policy.yml", []byte(policyText), m)
	if err != nil {
		t.Fatal(err)
	}
	gcfg, err := gate.DecodeConfig(pol.Gate)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gcfg, "test")
	if err != nil {
		t.Fatal(err)
	}
	return guard.New(guard.Config{Policy: pol, Gate: g, State: st, DeviceID: m.Device.ID})
}

// Nonces spends approval nonces in the store, as the daemon does.
type Nonces struct{ St *store.Store }

// Consume spends nonce until exp.
func (n Nonces) Consume(nonce string, exp time.Time) (bool, error) {
	return n.St.ConsumeNonce(nonce, exp)
}

// ReadFile is the text of the file at path (a policy to open a Rig with).
func ReadFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
