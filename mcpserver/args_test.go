package mcpserver_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestArgumentNamesAreExact: a call whose arguments a case-insensitive or
// last-duplicate-wins reader would read differently from an exact one is
// refused, and nothing moves.
func TestArgumentNamesAreExact(t *testing.T) {
	r := newRig(t, false)
	for _, args := range []string{
		`{"Value":30,"idempotency_key":"case-1"}`,
		`{"VALUE":30,"IDEMPOTENCY_KEY":"case-2"}`,
		`{"value":10,"Value":30,"idempotency_key":"case-3"}`,
		`{"value":10,"value":30,"idempotency_key":"case-4"}`,
		`{"value":10,"idempotency_key":"case-5","idempotency_key":"case-5b"}`,
		`{"value":10,"idempotency_key":"case-6","Source":"battery_gw_01"}`,
	} {
		res, err := r.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_c", Arguments: json.RawMessage(args)})
		if err != nil {
			continue // refused by the protocol layer: fine
		}
		if !res.IsError || !strings.Contains(text(res), "argument") && !strings.Contains(text(res), "twice") {
			t.Errorf("%s: isError=%v %s", args, res.IsError, text(res))
		}
	}
	if w := r.allWrites(); w != 0 {
		t.Errorf("argument names outside the schema moved the plant %d times", w)
	}
	// The exact names still work.
	r.succeeds(t, do("do_heater_zone_c", 20, "case-ok"))
}
