package node_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/audit"
	_ "github.com/physd/physd/drivers/modbus" // registers modbus_tcp
	"github.com/physd/physd/drivers/modbus/modbustest"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

const verifyManifest = `physmcp_version: "0.1"
device: {id: plc_node, type: test, location: {zone: z}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  plc: {type: modbus_tcp, address: "ADDR", timeout_ms: 500}
capabilities:
  - name: pump
    kind: do
    description: A pump whose run command shows in a status input.
    binding: {type: modbus, bus: plc, table: coil, address: 5, verify: {table: discrete, address: 105}}
    data_type: bool
    semantic_tags: [pump]
`

// TestRecoveryJudgesByTheVerifyPoint: after a crash, a pending do_ on a
// point with a verify point is judged by the verify point, not by the
// written coil (which holds the command whether or not the pump runs).
func TestRecoveryJudgesByTheVerifyPoint(t *testing.T) {
	bank := modbustest.NewBank(200)
	srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"stuck"} {
		st.Begin(store.LedgerEntry{Key: k, Tool: "do_pump", ArgsHash: "h", Created: time.Now(), Pending: json.RawMessage(`{"value":true}`)}, nil)
	}
	st.Close()
	// The coil holds the command; the status input says the pump is off.
	bank.SetCoil(1, 5, true)
	bank.SetDiscrete(1, 105, false)

	m, err := manifest.Parse("m.yml", []byte(strings.Replace(verifyManifest, "ADDR", srv.Addr, 1)))
	if err != nil {
		t.Fatal(err)
	}
	recoverWith := func() *store.Store {
		st, err := store.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		al, err := audit.Open(dir + "/audit")
		if err != nil {
			t.Fatal(err)
		}
		n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
		if err != nil {
			t.Fatal(err)
		}
		n.Close(context.Background())
		al.Close()
		return st
	}
	st = recoverWith()
	defer st.Close()
	for _, k := range []string{"stuck"} {
		e, _ := st.Lookup(k)
		if e == nil || e.State != store.StateDone {
			t.Fatalf("%s not recovered: %+v", k, e)
		}
		var got promcp.DoResult
		json.Unmarshal(e.Response, &got)
		if got.Status != promcp.StatusPartial || got.Verified || !strings.Contains(got.Reason, "verify point unit 1 discrete 10106 (address 105) false") ||
			!strings.Contains(got.Details, "verify=unit 1 discrete 10106 (address 105) shows false, expected true") {
			t.Errorf("%s: recovered as %+v, want partial judged by the status input", k, got)
		}
	}
}
