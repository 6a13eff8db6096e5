package mcpserver_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestHostileArgumentNamesAreExact: do_ arguments are matched by their exact
// names. encoding/json matches struct fields case-insensitively and keeps
// the last duplicate, so {"value": 10, "Value": 95} runs 95 while a proxy,
// a log reader or a client-side validator that reads "value" sees 10, and
// {"VALUE": 95} passes although the inputSchema has additionalProperties
// false. Each must be a tool error naming the argument, with nothing moved.
func TestHostileArgumentNamesAreExact(t *testing.T) {
	r := newRig(t, false)
	for _, args := range []string{
		`{"Value":40,"idempotency_key":"n-1"}`,
		`{"VALUE":40,"IDEMPOTENCY_KEY":"n-2"}`,
		`{"value":10,"Value":40,"idempotency_key":"n-3"}`,
		`{"value":10,"value":40,"idempotency_key":"n-4"}`,
		`{"value":10,"idempotency_key":"n-5","idempotency_key":"n-5b"}`,
		`{"value":10,"Idempotency_Key":"n-6"}`,
	} {
		res, err := r.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_c", Arguments: json.RawMessage(args)})
		if err == nil && !res.IsError {
			t.Errorf("%s: accepted (%v); want a tool error naming the argument", args, res.StructuredContent)
		}
	}
	if w := r.plant.Stats().Points["zone_c.heater"].Writes; w != 0 {
		t.Errorf("argument names outside the schema moved the heater %d times", w)
	}
}
