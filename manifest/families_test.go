package manifest

import (
	"os"
	"strings"
	"testing"
)

// TestFamilyOneMemberPerZone: the zone argument must pick one member, so
// two members of a family in one zone are refused at the second one.
func TestFamilyOneMemberPerZone(t *testing.T) {
	b, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(b), "    zone: zone_c\n    binding: {type: sim, bus: plant, point: zone_c.heater}", "    zone: zone_a\n    binding: {type: sim, bus: plant, point: zone_c.heater}", 1)
	if text == string(b) {
		t.Fatal("the greenhouse's heater_zone_c block changed; update this test")
	}
	_, err = Parse("gh.yml", []byte(text))
	if err == nil || !strings.Contains(err.Error(), "heater_zone_a and heater_zone_c are both family heater in zone zone_a") {
		t.Fatalf("two heaters in zone_a: %v", err)
	}
	if m, err := Parse("gh.yml", b); err != nil || m.Capabilities[0].Family != "temperature" {
		t.Fatalf("the greenhouse: %v", err)
	}
}
