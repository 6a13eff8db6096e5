package e2e

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestSIGTERMFinishesInFlightActuation: a do_ that is running when the
// daemon is told to stop completes and is answered; then physd exits 0.
func TestSIGTERMFinishesInFlightActuation(t *testing.T) {
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	// Each device access of the fan now takes 500 ms: the actuation spans
	// read, write and read-back, about 1.5 s (timeout_ms is 2000).
	body := `{"point":"zone_b.fan","mode":"slow","delay_ms":500}`
	if code := postJSON(t, d.url("/sim/plant/fault"), body); code != 200 {
		t.Fatalf("fault: %d", code)
	}
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	got := make(chan answer, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_fan_zone_b", Arguments: map[string]any{"value": 55, "idempotency_key": "in-flight"}})
		got <- answer{res, err}
	}()
	time.Sleep(300 * time.Millisecond) // the actuation is under way
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil {
		t.Fatalf("in-flight do_ lost on SIGTERM: %v\n%s", a.err, d.stderr.String())
	}
	if r := structured(t, a.res); r["status"] != "success" || r["verified"] != true {
		t.Errorf("in-flight do_: %v", r)
	}
	select {
	case err := <-d.done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("physd did not exit after SIGTERM")
	}
	b, _ := os.ReadFile(d.state + "/audit/audit.jsonl")
	if !strings.Contains(string(b), `"idempotency_key":"in-flight"`) {
		t.Errorf("audit lacks the in-flight actuation:\n%s", b)
	}
}
