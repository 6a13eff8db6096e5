package mqtt

import (
	"encoding/json"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

func testManifest() *manifest.Manifest {
	return &manifest.Manifest{
		Device: manifest.Device{ID: "gw1", Type: "greenhouse_controller", Vendor: "Acme", Location: manifest.Location{Zone: "zone_a"}},
		Capabilities: []*manifest.Capability{
			{Name: "temperature_zone_a", Kind: "read", DataType: "float", Unit: "celsius"},
			{Name: "humidity_zone_a", Kind: "read", DataType: "float", Unit: "percent", SemanticTags: []string{"humidity"}},
			{Name: "mode", Kind: "read", DataType: "enum", EnumValues: []string{"auto", "manual"}},
			{Name: "heater_zone_a", Kind: "do", DataType: "float", Unit: "percent"},
			{Name: "door_open", Kind: "read", DataType: "bool"},
		},
	}
}

// deadURL is a broker address nothing listens on.
func deadURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "tcp://" + addr
}

func TestDiscoveryConfig(t *testing.T) {
	m := testManifest()
	p, err := New(Config{URL: deadURL(t), Prefix: "site/physd"}, m)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	temp := p.Discovery(m.Capabilities[0])
	if temp.Unit != "°C" || temp.DeviceClass != "temperature" || temp.StateClass != "measurement" {
		t.Errorf("temperature: unit %q class %q state_class %q, want °C temperature measurement", temp.Unit, temp.DeviceClass, temp.StateClass)
	}
	if temp.DefaultEntityID != "sensor.gw1_temperature_zone_a" || temp.UniqueID != "physd_gw1_read_temperature_zone_a" {
		t.Errorf("ids %q %q", temp.DefaultEntityID, temp.UniqueID)
	}
	if temp.StateTopic != "site/physd/gw1/obs/read_temperature_zone_a" || temp.AvailabilityTopic != "site/physd/gw1/availability" {
		t.Errorf("topics %q %q", temp.StateTopic, temp.AvailabilityTopic)
	}
	if !slices.Equal(temp.Device.Identifiers, []string{"physd_gw1"}) || temp.Device.Manufacturer != "Acme" || temp.Device.SuggestedArea != "zone_a" {
		t.Errorf("device %+v", temp.Device)
	}
	if hum := p.Discovery(m.Capabilities[1]); hum.Unit != "%" || hum.DeviceClass != "humidity" {
		t.Errorf("humidity: unit %q class %q, want %% humidity", hum.Unit, hum.DeviceClass)
	}
	if mode := p.Discovery(m.Capabilities[2]); mode.DeviceClass != "enum" || !slices.Equal(mode.Options, []string{"auto", "manual"}) || mode.StateClass != "" || mode.Unit != "" {
		t.Errorf("enum: %+v", mode)
	}
	if got := p.DiscoveryTopic(m.Capabilities[2]); got != "homeassistant/sensor/gw1/read_mode/config" {
		t.Errorf("discovery topic %q", got)
	}
	door := p.Discovery(m.Capabilities[4])
	if got := p.DiscoveryTopic(m.Capabilities[4]); got != "homeassistant/binary_sensor/gw1/read_door_open/config" {
		t.Errorf("bool discovery topic %q, want a binary_sensor", got)
	}
	if door.PayloadOn != "ON" || door.PayloadOff != "OFF" || door.DefaultEntityID != "binary_sensor.gw1_door_open" || door.StateClass != "" ||
		door.ValueTemplate != "{{ 'ON' if value_json.value else 'OFF' }}" {
		t.Errorf("bool: %+v", door)
	}
}

// TestUnreachableBrokerNeverBlocks: with no broker, publishing returns at
// once and every message is dropped and counted; unchanged observations
// are not published at all.
func TestUnreachableBrokerNeverBlocks(t *testing.T) {
	m := testManifest()
	p, err := New(Config{URL: deadURL(t), Queue: 4}, m)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	o := node.Observed{Cap: m.Capabilities[0], Obs: promcp.Observation{Value: 21.5, Quality: promcp.QualityGood}, Changed: true}
	for range 1000 {
		p.Observe(o)
	}
	p.Observe(node.Observed{Cap: m.Capabilities[0], Obs: o.Obs, Changed: false})
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := p.Stats()
		if s.DroppedFull+s.DroppedOffline == 1000 {
			if s.Published != 0 || s.Connected {
				t.Fatalf("stats %+v: nothing can be published without a broker", s)
			}
			break
		}
		if s.DroppedFull+s.DroppedOffline > 1000 || time.Now().After(deadline) {
			t.Fatalf("stats %+v: want 1000 dropped (the unchanged observation is not sent)", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConfigErrors(t *testing.T) {
	m := testManifest()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{URL: "http://b:1883"}, `scheme "http"`},
		{Config{URL: "tcp://broker"}, "lacks a host and port"},
		{Config{URL: "tcp://b:1883", Prefix: "a/#"}, "wildcard"},
		{Config{URL: "tcp://b:1883", Prefix: "/a"}, "starts or ends with /"},
		{Config{URL: "tcp://b:1883", DiscoveryPrefix: "ha/+"}, "mqtt discovery prefix"},
	} {
		_, err := New(c.cfg, m)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "fix:") {
			t.Errorf("%+v: err %v, want %q with a fix", c.cfg, err, c.want)
		}
	}
}

func TestResultOfAuditLines(t *testing.T) {
	answer := `{"status":"partial","verified":false,"code":"unverified","idempotency_key":"k1","requested_value":40,"applied_value":40,"previous_value":10,"timestamp":"2026-12-01T10:00:00Z","policy":{"configured":true}}`
	line, _ := json.Marshal(audit.Record{Seq: 7, Event: "do", Tool: "do_heater", Caller: "alice", Status: "partial", Answer: json.RawMessage(answer)})
	r, ok := resultOf(line)
	if !ok || r.Capability != "do_heater" || r.Event != "do" || r.Status != "partial" || r.Verified || r.Code != "unverified" ||
		r.IdempotencyKey != "k1" || r.AppliedValue != 40.0 || r.PreviousValue != 10.0 || r.AuditSeq != 7 {
		t.Errorf("do line: %+v %v", r, ok)
	}
	if b, _ := json.Marshal(r); strings.Contains(string(b), "alice") || strings.Contains(string(b), "policy") {
		t.Errorf("the result carries the caller or the policy note: %s", b)
	}
	line, _ = json.Marshal(audit.Record{Seq: 8, Event: "do_refused", Tool: "do_heater", Status: "failed", IdempotencyKey: "k2", Reason: "denied by rule r1"})
	if r, ok := resultOf(line); !ok || r.Status != "failed" || r.Event != "do_refused" || r.Reason != "denied by rule r1" {
		t.Errorf("refusal line: %+v %v", r, ok)
	}
	for _, ev := range []string{"alarm_raised", "audit_check", "policy_reload"} {
		line, _ = json.Marshal(audit.Record{Event: ev, Tool: "read_x"})
		if _, ok := resultOf(line); ok {
			t.Errorf("%s published as a do_ result", ev)
		}
	}
}
