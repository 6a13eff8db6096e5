package mesh

import (
	"log/slog"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// ConfigFromManifest maps network.mesh (and device.id) to a Config and
// loads the key (key_file or key_env). heartbeat_interval_ms becomes the
// failure detector's probe interval; max_peers is not used here (the
// caller may cap fan-out with it).
func ConfigFromManifest(m *manifest.Manifest, logger *slog.Logger) (Config, error) {
	ms := m.Network.Mesh
	key, err := ms.LoadKey()
	if err != nil {
		return Config{}, err
	}
	cfg := Config{
		NodeName:          m.Device.ID,
		BindAddr:          ms.Bind,
		BindPort:          ms.Port,
		AdvertiseAddr:     ms.AdvertiseAddr,
		AdvertisePort:     ms.AdvertisePort,
		Seeds:             append([]string(nil), ms.SeedPeers...),
		Label:             ms.Label,
		SecretKey:         key,
		ExpectedSize:      ms.ExpectedSize,
		RequestTimeout:    time.Duration(ms.RequestTimeoutMS) * time.Millisecond,
		ReconnectInterval: time.Duration(ms.ReconnectIntervalMS) * time.Millisecond,
		ProbeInterval:     time.Duration(ms.HeartbeatIntervalMS) * time.Millisecond,
		Logger:            logger,
	}
	return cfg, nil
}

// CatalogFromManifest lists the manifest's tools as a Catalog: one entry
// per tool (read_x / do_x) with its kind, zone, unit, semantic tags and
// range. A capability that is not exposed is no tool: the site neither
// lists nor routes it.
func CatalogFromManifest(m *manifest.Manifest) Catalog {
	cat := Catalog{DeviceID: m.Device.ID, Zone: m.Device.Location.Zone, Area: m.Device.Location.Area}
	for _, c := range m.ExposedCapabilities() {
		e := CatalogEntry{Tool: c.ToolName(), Kind: c.Kind, Zone: c.Zone, Unit: c.Unit, Tags: append([]string(nil), c.SemanticTags...),
			DataType: c.DataType, Description: c.Description, EnumValues: c.EnumValues, SideEffects: c.SideEffects, Family: c.Family}
		if c.Range != nil {
			lo, hi := c.Range.Min, c.Range.Max
			e.Min, e.Max = &lo, &hi
		}
		if c.Lease != nil && c.Safe != nil {
			e.Lease = &CatalogLease{DefaultS: c.Lease.DefaultS, MaxS: c.Lease.MaxS, SafeValue: promcp.FormatValue(c.Safe.Value)}
		}
		cat.Capabilities = append(cat.Capabilities, e)
	}
	return cat
}
