package fleet

import (
	"testing"
	"time"

	"github.com/physd/physd/manifest"
)

// TestCatalogOfPointsThatAreNotTools: a capability with expose: false is
// neither listed nor served to the fleet, and each listed tool keeps its
// own freshness bound (the catalog's entries are the exposed ones: an
// entry matched to the manifest by position took a hidden point's bound).
func TestCatalogOfPointsThatAreNotTools(t *testing.T) {
	doc := `physmcp_version: "0.1"
device: {id: gw_a, type: gateway, location: {zone: greenhouse}}
network: {protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080, role: native}], mesh: {enabled: false}}
capabilities:
  - name: hidden_temp
    kind: read
    description: observed, not a tool
    binding: {type: sim, address: h}
    data_type: float
    semantic_tags: [temperature]
    poll_ms: 60000
    expose: false
  - name: temp
    kind: read
    description: d
    binding: {type: sim, address: t}
    data_type: float
    semantic_tags: [temperature]
    poll_ms: 1000
`
	m, err := manifest.Parse("t.yml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	cat := CatalogOf(m, "north", manifest.FleetServes, "i", StateServing, time.Second)
	if len(cat.Capabilities) != 1 || cat.Capabilities[0].Tool != "read_temp" {
		t.Fatalf("catalog %+v: want read_temp only", cat.Capabilities)
	}
	if got, want := cat.Capabilities[0].StaleAfterMS, m.Capability("temp").StaleAfter().Milliseconds(); got != want || got == m.Capability("hidden_temp").StaleAfter().Milliseconds() {
		t.Errorf("read_temp's stale_after_ms %d, want its own %d", got, want)
	}
}
