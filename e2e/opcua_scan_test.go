package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/opcua/opcuatest"
)

// TestScanOPCUA: commissioning against node-opcua, an OPC UA server
// implementation independent of physd's gopcua client. The built binary
// scans the server, `physd validate` accepts the skeleton unedited, and a
// daemon started on it serves, over MCP, the server's values with quality
// good; the Setpoint's EURange (0..100) and EngineeringUnits (°C) became
// the capability's range and unit, and the writable Setpoint is offered as
// a read, not an actuator.
func TestScanOPCUA(t *testing.T) {
	t.Parallel() // its own server on a free port and its own daemon
	srv := opcuatest.Start(t, opcuatest.Options{})
	skel := filepath.Join(t.TempDir(), "plant.yml")
	out, err := exec.Command(physdBin, "scan", "opcua", srv.Endpoint, "--out", skel).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "wrote "+skel) {
		t.Fatalf("scan: %v\n%s", err, out)
	}
	if out, err := exec.Command(physdBin, "validate", skel).CombinedOutput(); err != nil || !strings.Contains(string(out), ": ok (device gw_opcua_001") {
		t.Fatalf("validate: %v\n%s", err, out)
	}

	d := startHTTP(t, daemonOpts{manifest: skel})
	cs := connectHTTP(t, d, "2026-07-28")
	if o := structured(t, call(t, cs, "read_plant_setpoint", map[string]any{})); o["quality"] != "good" || o["value"] != 20.0 || o["unit"] != "celsius" {
		t.Errorf("read_plant_setpoint: %v, want the server's 20 °C, good", o)
	}
	if o := structured(t, call(t, cs, "read_plant_temperature", map[string]any{})); o["quality"] != "good" {
		t.Errorf("read_plant_temperature: %v", o)
	} else if v, _ := o["value"].(float64); v < 21 || v > 22 {
		t.Errorf("read_plant_temperature: %v, the server holds 21.5±0.1", o["value"])
	}
	if o := structured(t, call(t, cs, "read_plant_curve_2", map[string]any{})); o["quality"] != "good" || o["value"] != 3.0 {
		t.Errorf("read_plant_curve_2 (element 2 of [1 2 3 4]): %v", o)
	}
	if o := structured(t, call(t, cs, "read_commissioning_line1_tank_level", map[string]any{})); o["quality"] != "good" || o["value"] != 1200.0 || o["unit"] != "litre" {
		t.Errorf("read_commissioning_line1_tank_level: %v", o)
	}

	res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "physmcp://manifest"})
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Capabilities []struct {
			Name, Kind, Unit string
			Range            *struct{ Min, Max float64 }
		}
	}
	if err := json.Unmarshal([]byte(res.Contents[0].Text), &m); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range m.Capabilities {
		if c.Kind != "read" {
			t.Errorf("%s is kind %s: a scan proposes no actuator", c.Name, c.Kind)
		}
		if c.Name == "plant_setpoint" {
			found = true
			if c.Unit != "celsius" || c.Range == nil || c.Range.Min != 0 || c.Range.Max != 100 {
				t.Errorf("plant_setpoint in physmcp://manifest: unit %q range %+v, want celsius 0..100 (the EURange)", c.Unit, c.Range)
			}
		}
	}
	if !found {
		src, _ := os.ReadFile(skel)
		t.Fatalf("no plant_setpoint among %d capabilities:\n%s", len(m.Capabilities), src)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if strings.HasPrefix(tool.Name, "do_") {
			t.Errorf("the skeleton serves %s", tool.Name)
		}
	}
}
