package opcua_test

import (
	"strings"
	"testing"

	"github.com/physd/physd/daemon"
	"github.com/physd/physd/manifest"
)

// TestValidateChecksBus: physd validate (daemon.CheckBindings) reports an
// opcua bus entry's problems, positioned, without opening the bus.
func TestValidateChecksBus(t *testing.T) {
	src := `physmcp_version: "0.1"
device: {id: gw_1, type: gateway, location: {zone: z1}}
network: {protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080}], mesh: {}}
buses:
  plc: {type: opcua, endpoint: "http://x:1", timeout_ms: 1}
capabilities:
  - name: t
    kind: read
    description: d
    data_type: float
    semantic_tags: [t]
    binding: {type: opcua, bus: plc, node: "ns=1;s=T"}
`
	m, err := manifest.Parse("plant.yml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	err = daemon.CheckBindings(m)
	if err == nil {
		t.Fatal("validate accepted a bad opcua bus")
	}
	for _, want := range []string{"plant.yml:5:", "buses.plc.endpoint", "not an opc.tcp:// URL", "timeout_ms must be between"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%v: no %q", err, want)
		}
	}
}
