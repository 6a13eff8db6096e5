package mesh

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/physd/physd/manifest"
)

func TestFromManifest(t *testing.T) {
	t.Setenv("PHYSD_TEST_MESH_KEY", hex.EncodeToString(testKey))
	doc := `physmcp_version: "0.1"
device: {id: gw_a, type: gateway, location: {zone: greenhouse}}
network:
  protocols: [{type: ip, address: 192.168.1.20, mcp_port: 8080}]
  mesh:
    bind: 192.168.1.20
    key_env: PHYSD_TEST_MESH_KEY
    label: site_north
    seed_peers: [gw_a/192.168.1.20:7946, gw_b/192.168.1.21:7946, 192.168.1.22]
    heartbeat_interval_ms: 500
capabilities:
  - name: temp
    kind: read
    description: d
    binding: {type: i2c, address: "0x48:reg=0x00"}
    data_type: float
    unit: celsius
    range: [-10, 50]
    semantic_tags: [temperature, air]
  - name: hidden_temp
    kind: read
    description: observed, not a tool
    binding: {type: i2c, address: "0x49:reg=0x00"}
    data_type: float
    semantic_tags: [temperature]
    expose: false
`
	m, err := manifest.Parse("t.yml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ConfigFromManifest(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != "gw_a" || cfg.BindAddr != "192.168.1.20" || cfg.BindPort != 7946 || cfg.Label != "site_north" ||
		len(cfg.SecretKey) != 32 || cfg.ExpectedSize != 3 || cfg.RequestTimeout != 500*time.Millisecond ||
		cfg.ReconnectInterval != 10*time.Second || cfg.ProbeInterval != 500*time.Millisecond || len(cfg.Seeds) != 3 {
		t.Errorf("cfg %+v", cfg)
	}
	if _, err := cfg.withDefaults(); err != nil {
		t.Error(err)
	}
	cat := CatalogFromManifest(m)
	e, ok := cat.Find("read_temp")
	if cat.DeviceID != "gw_a" || !ok || e.Zone != "greenhouse" || e.Unit != "celsius" || *e.Min != -10 || *e.Max != 50 || len(e.Tags) != 2 {
		t.Errorf("catalog %+v", cat)
	}
	if _, ok := cat.Find("read_hidden_temp"); ok || len(cat.Capabilities) != 1 {
		t.Errorf("the catalog routes an unexposed capability: %+v", cat)
	}
}
