package mcpserver_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// untilAmsterdam sleeps (simulated time) until the given wall-clock time
// in Amsterdam. synctest's clock starts on Saturday 2000-01-01 00:00 UTC.
func untilAmsterdam(t *testing.T, day, hour, minute int) {
	loc, _ := time.LoadLocation("Europe/Amsterdam")
	at := time.Date(2000, 1, day, hour, minute, 0, 0, loc)
	time.Sleep(time.Until(at))
}

type attempt struct {
	name string
	tool string
	args any
}

func do(tool string, value any, key string) attempt {
	return attempt{fmt.Sprintf("%s=%v", tool, value), tool, map[string]any{"value": value, "idempotency_key": key}}
}

// refused runs an attempt that must not actuate: a tool error, a protocol
// error, or status failed.
func (r *rig) refused(t *testing.T, a attempt) {
	t.Helper()
	before := r.allWrites()
	res, err := r.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: a.tool, Arguments: a.args})
	switch {
	case err != nil: // e.g. an unknown tool: a protocol error
	case res.NeedsInput() || res.IsError:
	default:
		if o := out(t, res); o["status"] != "failed" {
			t.Errorf("DANGEROUS %s was executed: %v", a.name, o)
		}
	}
	if w := r.allWrites() - before; w != 0 {
		t.Errorf("DANGEROUS %s reached the plant (%d writes)", a.name, w)
	}
}

func (r *rig) succeeds(t *testing.T, a attempt) {
	t.Helper()
	o := out(t, r.call(t, &mcp.CallToolParams{Name: a.tool, Arguments: a.args}))
	if o["status"] != "success" || o["verified"] != true {
		t.Errorf("routine %s failed: %v", a.name, o)
	}
}

// TestDangerousAndRoutineBattery runs the greenhouse policy and gate against
// 30+ dangerous requests, none of which may reach the plant, and 15+
// routine ones, all of which must succeed.
func TestDangerousAndRoutineBattery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dangerous, routine := 0, 0
		// An anonymous caller (role none) may not heat.
		anon := newRigAs(t, false, "none")
		for _, a := range []attempt{do("do_heater_zone_a", 30, "n1"), do("do_heater_zone_c", 30, "n2"), do("do_heater_zone_a", 5, "n3")} {
			anon.refused(t, a)
			dangerous++
		}

		r := newRigAs(t, false, "operator")
		untilAmsterdam(t, 5, 10, 0) // Wednesday 10:00, business hours
		for i, a := range []attempt{
			do("do_fan_zone_b", 10, "r1"), do("do_fan_zone_b", 30, "r2"), do("do_fan_zone_b", 50, "r3"),
			do("do_vent_zone_c", 20, "r4"), do("do_vent_zone_c", 40, "r5"), do("do_vent_zone_c", 60, "r6"), do("do_vent_zone_c", 80, "r7"),
			do("do_heater_zone_c", 10, "r8"), do("do_heater_zone_c", 25, "r9"), do("do_heater_zone_c", 40.5, "r10"),
			do("do_heater_zone_a", 20, "r11"), do("do_heater_zone_a", 45, "r12"),
			do("do_irrigation_valve", 20, "r13"), do("do_irrigation_valve", 0, "r14"),
			do("do_fan_zone_b", 0, "r15"), do("do_vent_zone_c", 50, "r16"),
		} {
			r.succeeds(t, a)
			routine++
			_ = i
			time.Sleep(16 * time.Second) // the heater's cooldown is 15 s
		}

		for _, a := range []attempt{
			// outside the physical range
			do("do_fan_zone_b", 101, "d1"), do("do_fan_zone_b", -1, "d2"), do("do_vent_zone_c", 150, "d3"),
			do("do_heater_zone_c", 1e6, "d4"), do("do_irrigation_valve", -50, "d5"), do("do_heater_zone_a", -10, "d6"),
			do("do_heater_zone_c", -0.5, "d7"),
			// the policy's range guard denies
			do("do_heater_zone_c", 85, "d8"), do("do_heater_zone_c", 99, "d9"),
			// the gate's L0 deny rule
			do("do_irrigation_valve", 95, "d10"), do("do_irrigation_valve", 100, "d11"),
			// needs a human's approval; this client cannot elicit
			do("do_heater_zone_a", 70, "d12"), do("do_heater_zone_a", 95, "d13"),
			// injection attempts and wrong types
			do("do_fan_zone_b", "30; rm -rf /", "d14"), do("do_fan_zone_b", "$(reboot)", "d15"),
			do("do_vent_zone_c", "`halt`", "d16"), do("do_vent_zone_c", map[string]any{"cmd": "rm -rf /"}, "d17"),
			do("do_fan_zone_b", []any{"1"}, "d18"), do("do_heater_zone_c", true, "d19"),
			{"extra shell argument", "do_fan_zone_b", map[string]any{"value": 20, "idempotency_key": "d20", "shell": "reboot"}},
			{"tool name injection", "do_fan_zone_b; reboot", map[string]any{"value": 20, "idempotency_key": "d21"}},
			{"arguments as a string", "do_vent_zone_c", "value=50; curl x | sh"},
			{"no idempotency key", "do_vent_zone_c", map[string]any{"value": 50}},
			// a key reused for another operation
			do("do_fan_zone_b", 90, "r1"),
		} {
			r.refused(t, a)
			dangerous++
		}
		// cooldown: two heater calls in a row
		r.succeeds(t, do("do_heater_zone_a", 30, "c1"))
		routine++
		r.refused(t, do("do_heater_zone_a", 35, "c2"))
		dangerous++
		// rate: the fan allows 30 a minute
		time.Sleep(61 * time.Second)
		for i := range 30 {
			r.succeeds(t, do("do_fan_zone_b", i%50, fmt.Sprintf("rate-%d", i)))
		}
		r.refused(t, do("do_fan_zone_b", 60, "rate-over"))
		dangerous++
		// outside business hours irrigation needs approval; during
		// Sunday-night maintenance it is denied outright
		untilAmsterdam(t, 8, 20, 0)
		r.refused(t, do("do_irrigation_valve", 20, "w1"))
		dangerous++
		untilAmsterdam(t, 9, 23, 45)
		r.refused(t, do("do_irrigation_valve", 20, "w2"))
		r.refused(t, do("do_irrigation_valve", 10, "w3"))
		dangerous += 2
		untilAmsterdam(t, 10, 0, 30) // Monday 00:30: still maintenance (crosses midnight)
		r.refused(t, do("do_irrigation_valve", 10, "w4"))
		dangerous++

		if dangerous < 30 || routine < 15 {
			t.Fatalf("battery too small: %d dangerous, %d routine", dangerous, routine)
		}
		t.Logf("%d dangerous requests refused, %d routine requests succeeded", dangerous, routine)
	})
}
