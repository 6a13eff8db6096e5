package mcpserver_test

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/sim"
)

// TestDoSendsProgress: a do_ whose device takes seconds tells a client that
// gave a progressToken, every second, that it is still under way; its
// answer says how long the verification took; a client without a token
// gets no notifications.
func TestDoSendsProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, false)
		var mu sync.Mutex
		var got []*mcp.ProgressNotificationParams
		r.progress = func(p *mcp.ProgressNotificationParams) {
			mu.Lock()
			got = append(got, p)
			mu.Unlock()
		}
		// Every read and write of the fan takes 900 ms: previous read,
		// write and read-back make 2.7 s.
		if err := r.plant.SetFault("zone_b.fan", sim.Fault{Mode: sim.FaultSlow, Delay: 900 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		p := &mcp.CallToolParams{Name: "do_fan_zone_b", Arguments: map[string]any{"value": 30, "idempotency_key": "progress-1"}}
		p.SetProgressToken("tok-1")
		o := out(t, r.call(t, p))
		if o["status"] != "success" {
			t.Fatalf("do_fan_zone_b: %v", o)
		}
		if ms, _ := o["verification_ms"].(float64); ms < 900 {
			t.Errorf("verification_ms = %v, want the read-back's 900 ms at least", o["verification_ms"])
		}
		synctest.Wait()
		mu.Lock()
		n := len(got)
		for _, g := range got {
			if g.ProgressToken != "tok-1" || g.Message == "" {
				t.Errorf("progress notification: %+v", g)
			}
		}
		mu.Unlock()
		if n < 2 {
			t.Errorf("%d progress notifications during a 2.7 s do_, want one a second", n)
		}
		// Without a token: none.
		o = out(t, r.call(t, &mcp.CallToolParams{Name: "do_fan_zone_b", Arguments: map[string]any{"value": 40, "idempotency_key": "progress-2"}}))
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(got) != n {
			t.Errorf("%d notifications for a call without a progressToken", len(got)-n)
		}
	})
}
