package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/audit"
	_ "github.com/physd/physd/drivers/modbus" // registers modbus_tcp, modbus_rtu
	"github.com/physd/physd/drivers/modbus/modbustest"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// TestExampleEndToEnd runs the example manifest through the node against
// the simulator: every capability reads good, do_ calls are verified by
// read-back, and a controller that goes away is reported, not guessed.
func TestExampleEndToEnd(t *testing.T) {
	b := newBoiler()
	srv, err := modbustest.StartTCP("127.0.0.1:0", b.bank)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	b.step(0.2)

	m, err := manifest.Load("../physmcp.manifest.yml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := m.Buses["boiler"].Config
	for i := 0; i+1 < len(cfg.Content); i += 2 {
		if cfg.Content[i].Value == "address" {
			cfg.Content[i+1].Value = srv.Addr // the manifest says 127.0.0.1:5020
		}
	}
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	if ok, checks := n.Ready(); !ok {
		t.Fatalf("not ready: %+v", checks)
	}
	ctx := context.Background()
	want := map[string]any{
		"do_flow_setpoint": 55.0, "do_pump_speed": int64(60), "do_operating_mode": "heating",
		"do_burner_enable": true, "do_pump_enable": true, "read_flame_detected": true,
		"read_boiler_alarm": false, "read_burner_hours": int64(0),
	}
	for _, c := range m.Capabilities {
		tool := c.ToolName()
		o, err := n.Read(ctx, tool, 0)
		if err != nil || o.Quality != promcp.QualityGood {
			t.Fatalf("%s: %+v, %v", tool, o, err)
		}
		if w, ok := want[tool]; ok && o.Value != w {
			t.Errorf("%s = %v, want %v", tool, o.Value, w)
		}
	}

	do := func(tool string, v any, key string) promcp.DoResult {
		raw, _ := json.Marshal(v)
		body, err := n.Do(ctx, node.DoRequest{Tool: tool, Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "test", Role: "admin"}})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		var r promcp.DoResult
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := do("do_flow_setpoint", 62.5, "k1")
	if r.Status != promcp.StatusSuccess || !r.Verified || r.AppliedValue != 62.5 || r.PreviousValue != 55.0 {
		t.Fatalf("do_flow_setpoint: %+v", r)
	}
	if got := int16(b.bank.Holding(1, 0, 1)[0]); got != 625 {
		t.Fatalf("the controller holds %d, want 625", got)
	}
	for tool, v := range map[string]any{"do_operating_mode": "hot_water", "do_burner_enable": false, "do_pump_speed": 35} {
		if r := do(tool, v, "k-"+tool); r.Status != promcp.StatusSuccess || !r.Verified {
			t.Fatalf("%s(%v): %+v", tool, v, r)
		}
	}

	// The controller goes away: the endpoint is marked down at the first
	// refused connection, reads serve the last value as degraded, and the
	// do_ pipeline refuses without touching anything.
	_ = srv.Stop()
	o, _ := n.Read(ctx, "read_boiler_flow_temperature", 0)
	if o.Quality != promcp.QualityDegraded || o.Value == nil || !strings.Contains(o.Reason, "marked down") {
		t.Fatalf("read with the controller gone: %+v", o)
	}
	r = do("do_pump_speed", 50, "k2")
	if r.Status != promcp.StatusFailed || r.Permission != promcp.PermSourceUnreachable {
		t.Fatalf("do with the controller gone: %+v", r)
	}
	deadline := time.Now().Add(5 * time.Second)
	for ready, _ := n.Ready(); ready; ready, _ = n.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("Ready still true with the controller gone")
		}
		_, _ = n.Read(ctx, "do_pump_speed", 0)
	}
	_, checks := n.Ready()
	for _, c := range checks {
		if c.Name == "bus:boiler" && !strings.Contains(c.Error, srv.Addr) {
			t.Fatalf("readiness check %+v should name the endpoint", c)
		}
	}
}
