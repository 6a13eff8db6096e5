package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func listed(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

// TestViewsThroughTheBinary: the built daemon serves a view over stdio
// (--view) with families on, refuses a call outside the view without
// touching the plant, lists its views in a resource, and tells a connected
// client on a policy reload (SIGHUP) that its tool list may have changed.
func TestViewsThroughTheBinary(t *testing.T) {
	t.Parallel()
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			t.Parallel()
			changed := make(chan struct{}, 4)
			cs, d := startStdioWith(t, era, daemonOpts{extra: []string{"--policy", greenhousePolicy, "--stdio-role", "operator", "--view", "zone_a", "--families", "on"}},
				func(context.Context, *mcp.ToolListChangedRequest) {
					select {
					case changed <- struct{}{}:
					default:
					}
				})
			want := []string{"can_do", "do_heater_zone_a", "do_irrigation_valve", "read_humidity_zone_a", "read_irrigation_valve_position", "read_temperature_zone_a"}
			if got := listed(t, cs); !slices.Equal(got, want) {
				t.Errorf("--view zone_a: tools\n got %v\nwant %v", got, want)
			}
			before := d.sim(t).writes("zone_c.heater")
			res := call(t, cs, "do_heater_zone_c", map[string]any{"value": 20, "idempotency_key": "e2e-view-" + era})
			if !res.IsError || !strings.Contains(text(res), "not in the view") {
				t.Errorf("do_heater_zone_c through view zone_a: %s", text(res))
			}
			if w := d.sim(t).writes("zone_c.heater") - before; w != 0 {
				t.Errorf("a call outside the view wrote %d times", w)
			}
			rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "physmcp://views"})
			if err != nil {
				t.Fatal(err)
			}
			var doc struct {
				Views []struct {
					Name, Endpoint string
				}
			}
			// Through a view, the resource shows that view only: the others
			// would name capabilities outside it.
			if err := json.Unmarshal([]byte(rr.Contents[0].Text), &doc); err != nil || len(doc.Views) != 1 || doc.Views[0].Endpoint != "/mcp/zone_a" {
				t.Errorf("views resource: %v %s", err, rr.Contents[0].Text)
			}
			if era == "2025-11-25" { // legacy sessions get list_changed without a subscription
				d.cmd.Process.Signal(syscall.SIGHUP)
				select {
				case <-changed:
				case <-time.After(20 * time.Second):
					t.Errorf("no tools/list_changed after SIGHUP\n%s", d.stderr.String())
				}
			}
		})
	}
}
