package policy_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

const man = `physmcp_version: "0.1"
device: {id: dev, type: t, location: {zone: z}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses: {plant: {type: sim}}
capabilities:
  - {name: heater, kind: do, description: heater power, binding: {type: sim, bus: plant, point: zone_a.heater}, data_type: float, unit: percent, range: {min: 0, max: 100}, semantic_tags: [heat], requires_permission: operator, rate_limit: 5/hour}
  - {name: fan, kind: do, description: fan speed, binding: {type: sim, bus: plant, point: zone_b.fan}, data_type: int, unit: percent, range: {min: 0, max: 100}, semantic_tags: [fan], cooldown_ms: 1000}
  - {name: vent, kind: do, description: vent opening, binding: {type: sim, bus: plant, point: zone_c.vent}, data_type: int, unit: percent, range: {min: 0, max: 100}, semantic_tags: [vent]}
  - {name: temp, kind: read, description: temperature, binding: {type: sim, bus: plant, point: zone_a.temperature}, data_type: float, unit: celsius, semantic_tags: [temperature]}
`

const pol = `physmcp_policy_version: "0.1"
time_windows:
  night:   {days: [mon, tue, wed, thu, fri, sat, sun], start: "22:00", end: "06:00", timezone: Europe/Amsterdam}
  early:   {days: [sun], start: "01:00", end: "05:00", timezone: Europe/Amsterdam}
  weekday: {days: [mon, tue, wed, thu, fri], start: "08:00", end: "17:00", timezone: UTC}
capabilities:
  do_heater:
    rules:
      - {type: permission, require: [operator]}
      - {type: rate, max: "3/min"}
      - {type: range_guard, min: 10, max: 80, on_violation: clamp}
      - {type: time_window, deny_during: [night]}
  do_fan:
    rules:
      - {type: cooldown, ms: 5000}
      - {type: range_guard, min: 20, max: 90, on_violation: deny}
      - {type: approval, when: above, above: 70}
  do_vent:
    rules:
      - {type: range_guard, min: 10, max: 90, on_violation: warn}
      - {type: time_window, allow_during: [weekday]}
      - {type: quorum, min_peers: 2}
`

func load(t *testing.T, p string) (*manifest.Manifest, *policy.Policy) {
	t.Helper()
	m, err := manifest.Parse("m.yml", []byte(man))
	if err != nil {
		t.Fatal(err)
	}
	pp, err := policy.Parse("p.yml", []byte(p), m)
	if err != nil {
		t.Fatal(err)
	}
	return m, pp
}

func ams(t *testing.T, s string) time.Time {
	loc, _ := time.LoadLocation("Europe/Amsterdam")
	tt, err := time.ParseInLocation("2006-01-02 15:04", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return tt
}

func TestWindowsAcrossMidnightAndDST(t *testing.T) {
	_, p := load(t, pol)
	night, early := p.Windows["night"], p.Windows["early"]
	for _, c := range []struct {
		at   string
		w    *policy.Window
		want bool
	}{
		{"2026-06-10 21:59", night, false},
		{"2026-06-10 22:00", night, true},
		{"2026-06-10 23:59", night, true},
		{"2026-06-11 05:59", night, true}, // the instance that began the evening before
		{"2026-06-11 06:00", night, false},
		{"2026-03-29 01:30", early, true}, // Sunday of the spring-forward change
		{"2026-03-29 03:30", early, true}, // 02:00–03:00 does not exist that night
		{"2026-03-29 05:00", early, false},
		{"2026-03-28 03:00", early, false}, // a Saturday
		{"2026-10-25 04:59", early, true},  // Sunday of the fall-back change
	} {
		if got := c.w.Contains(ams(t, c.at)); got != c.want {
			t.Errorf("%s in %s: %v, want %v", c.at, c.w.Name, got, c.want)
		}
	}
	// The instance keeps its wall-clock meaning: 3 real hours in spring,
	// 5 in autumn.
	if d := early.End(ams(t, "2026-03-29 01:30")).Sub(early.NextStart(ams(t, "2026-03-28 12:00"))); d != 3*time.Hour {
		t.Errorf("spring-forward window lasts %s, want 3h", d)
	}
	if d := early.End(ams(t, "2026-10-25 01:30")).Sub(early.NextStart(ams(t, "2026-10-24 12:00"))); d != 5*time.Hour {
		t.Errorf("fall-back window lasts %s, want 5h", d)
	}
}

func check(p *policy.Policy, lim *policy.Limiter, tool string, v any, role string, at time.Time) policy.Outcome {
	return p.Evaluate(context.Background(), policy.Check{Tool: tool, Value: v, Role: role, Now: at}, lim, nil)
}

// actuate takes the rate and cooldown slot the way a real do_ does and
// begins it (the device is touched); it returns the history to persist.
func actuate(t *testing.T, p *policy.Policy, lim *policy.Limiter, tool string, v any, role string, at time.Time) (string, []byte) {
	t.Helper()
	o := p.Evaluate(context.Background(), policy.Check{Tool: tool, Value: v, Role: role, Now: at, Reserve: true}, lim, nil)
	if o.Permission != promcp.PermAllowed || o.Slot == nil {
		t.Fatalf("actuate %s: %+v", tool, o)
	}
	return o.Slot.Begin(at)
}

func TestPolicyMatrix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, p := load(t, pol)
		lim := policy.NewLimiter(nil)
		noon := ams(t, "2026-06-10 12:00") // a Wednesday
		// Roles: the stricter of manifest and policy (operator); admin passes.
		if o := check(p, lim, "do_heater", 50.0, "none", noon); o.Permission != promcp.PermPermissionInsufficient || !strings.Contains(o.Details, "required_role=operator") {
			t.Errorf("role none: %+v", o)
		}
		if o := check(p, lim, "do_heater", 50.0, "admin", noon); o.Permission != promcp.PermAllowed {
			t.Errorf("role admin: %+v", o)
		}
		// Windows: denied at night with the reset time.
		if o := check(p, lim, "do_heater", 50.0, "operator", ams(t, "2026-06-10 23:00")); o.Permission != promcp.PermPolicyDenied || !strings.Contains(o.Details, "window_resets_at=2026-06-11T04:00:00Z") {
			t.Errorf("night: %+v", o)
		}
		// Clamp vs deny vs warn.
		if o := check(p, lim, "do_heater", 95.0, "operator", noon); o.Permission != promcp.PermAllowed || o.Value != 80.0 || !strings.Contains(o.Details, "clamped_to=80") {
			t.Errorf("clamp: %+v", o)
		}
		if o := check(p, lim, "do_fan", int64(95), "", noon); o.Permission != promcp.PermOutOfRange {
			t.Errorf("deny: %+v", o)
		}
		wed := time.Date(2026, 6, 10, 12, 0, 0, 0, time.UTC)
		o := p.Evaluate(context.Background(), policy.Check{Tool: "do_vent", Value: int64(95), Now: wed}, lim, func(context.Context, int) int { return 2 })
		if o.Permission != promcp.PermAllowed || !strings.Contains(strings.Join(o.Notes, ";"), "warning") || o.Value != int64(95) {
			t.Errorf("warn: %+v", o)
		}
		// Quorum: a standalone node has one live peer.
		if o := check(p, lim, "do_vent", int64(50), "", wed); o.Permission != promcp.PermPartitionNoQuorum || !strings.Contains(o.Details, "alive=1; required=2") {
			t.Errorf("quorum: %+v", o)
		}
		// Outside the allow window (a Saturday).
		if o := check(p, lim, "do_vent", int64(50), "", time.Date(2026, 6, 13, 12, 0, 0, 0, time.UTC)); o.Permission != promcp.PermPolicyDenied {
			t.Errorf("allow_during on a Saturday: %+v", o)
		}
		// Approval above 70.
		if o := check(p, lim, "do_fan", int64(75), "", noon); o.Permission != promcp.PermRequiresHumanApproval {
			t.Errorf("approval: %+v", o)
		}
		// Rate: 3/min from the policy (the manifest's 5/hour is looser here).
		// Simulated time runs from noon on.
		t0 := time.Now()
		clock := func() time.Time { return noon.Add(time.Since(t0)) }
		for i := range 3 {
			if o := check(p, lim, "do_heater", 50.0, "operator", clock()); o.Permission != promcp.PermAllowed {
				t.Fatalf("call %d: %+v", i, o)
			}
			actuate(t, p, lim, "do_heater", 50.0, "operator", clock())
			time.Sleep(time.Second)
		}
		o = check(p, lim, "do_heater", 50.0, "operator", clock())
		if o.Permission != promcp.PermRateLimited || !strings.Contains(o.Details, "retry_after_ms=57000") {
			t.Errorf("4th call in a minute: %+v", o)
		}
		time.Sleep(57 * time.Second)
		if o := check(p, lim, "do_heater", 50.0, "operator", clock()); o.Permission != promcp.PermAllowed {
			t.Errorf("after the window slid: %+v", o)
		}
		// The manifest's 5/hour still applies: two more, then refused.
		for range 2 {
			actuate(t, p, lim, "do_heater", 50.0, "operator", clock())
			time.Sleep(30 * time.Second)
		}
		if o := check(p, lim, "do_heater", 50.0, "operator", clock()); o.Permission != promcp.PermRateLimited || !strings.Contains(o.Details, "source=manifest") {
			t.Errorf("manifest rate: %+v", o)
		}
		// Cooldown: the policy's 5 s beats the manifest's 1 s.
		actuate(t, p, lim, "do_fan", int64(50), "", clock())
		time.Sleep(4 * time.Second)
		if o := check(p, lim, "do_fan", int64(50), "", clock()); o.Permission != promcp.PermCooldownActive || !strings.Contains(o.Details, "retry_after_ms=1000") {
			t.Errorf("cooldown: %+v", o)
		}
		time.Sleep(time.Second)
		if o := check(p, lim, "do_fan", int64(50), "", clock()); o.Permission != promcp.PermAllowed {
			t.Errorf("after cooldown: %+v", o)
		}
	})
}

func TestLimitsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	_, p := load(t, pol)
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	lim := policy.NewLimiter(st)
	now := ams(t, "2026-06-10 12:00")
	for i := range 3 {
		k, v := actuate(t, p, lim, "do_heater", 50.0, "operator", now.Add(time.Duration(i)*time.Millisecond))
		if err := st.Put(policy.StateBucket, k, v); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	st, err = store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim = policy.NewLimiter(st)
	if o := p.Evaluate(context.Background(), policy.Check{Tool: "do_heater", Value: 50.0, Role: "operator", Now: now.Add(time.Second)}, lim, nil); o.Permission != promcp.PermRateLimited {
		t.Errorf("after restart: %+v", o)
	}
}

func TestPolicyErrors(t *testing.T) {
	m, err := manifest.Parse("m.yml", []byte(man))
	if err != nil {
		t.Fatal(err)
	}
	bad := `physmcp_policy_version: "0.1"
time_windows:
  w: {days: [mon, funday], start: "25:00", end: "06:00", timezone: Mars/Base}
capabilities:
  do_nothing: {rules: []}
  read_temp: {rules: []}
  do_heater:
    rules:
      - {type: time_window, allow_during: [nowhere]}
      - {type: range_guard, min: 90, max: 10, on_violation: clamp}
      - {type: range_guard, min: 200, max: 300, on_violation: deny}
      - {type: rate, max: "often"}
      - {type: teleport}
      - {type: cooldown, ms: 5, max: 3}
      - {type: approval, when: above, above: 100}
identity:
  tokens: [{id: x, sha256: plaintext-token, role: operator}]
colour: blue
`
	_, err = policy.Parse("p.yml", []byte(bad), m)
	if err == nil {
		t.Fatal("bad policy accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		"p.yml:3:", "funday", "25:00", "Mars/Base",
		`unknown tool "do_nothing"`, "read_temp is an observation",
		`unknown time window "nowhere"`, "min (90) is greater than max (10)", "unreachable rule: [200, 300]",
		`invalid rate "often"`, `unknown rule type "teleport"`, `"max" does not belong to a cooldown rule`,
		"unreachable rule: no value is above 100", "64 hex characters", "colour",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("errors lack %q:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "p.yml:"); n < 14 {
		t.Errorf("want every error positioned, got %d:\n%s", n, msg)
	}
}

func TestIdentityTokens(t *testing.T) {
	m, _ := manifest.Parse("m.yml", []byte(man))
	p, err := policy.Parse("p.yml", []byte(`physmcp_policy_version: "0.1"
identity:
  tokens: [{id: ops, sha256: `+policy.TokenHash("s3cret-operator-token")+`, role: operator}]
`), m)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := p.Identity.Authenticate("s3cret-operator-token")
	if err != nil || pr.Role != "operator" || pr.ID != "token:ops" {
		t.Errorf("known token: %+v %v", pr, err)
	}
	if _, err := p.Identity.Authenticate("guess"); err == nil {
		t.Error("unknown token accepted")
	}
}

func TestMaxChangeRules(t *testing.T) {
	m, err := manifest.Parse("m.yml", []byte(man))
	if err != nil {
		t.Fatal(err)
	}
	bad := `physmcp_policy_version: "0.1"
defaults: {max_change_percent: 150}
capabilities:
  do_heater:
    rules:
      - {type: max_change, max: 0}
      - {type: max_change, max: 100}
  do_fan:
    rules:
      - {type: max_change}
      - {type: max_change, max: "9", min: 3}
`
	_, err = policy.Parse("p.yml", []byte(bad), m)
	if err == nil {
		t.Fatal("bad max_change rules accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		"p.yml:2:32: defaults.max_change_percent: 150 is out of range",
		"p.yml:6:33: capabilities.do_heater.rules[0].max: must be a positive number, got 0",
		"p.yml:7:33: capabilities.do_heater.rules[1].max: unreachable rule: no step inside the range is larger than 100",
		"p.yml:10:9: capabilities.do_fan.rules[0].max: required",
		`"min" does not belong to a max_change rule`,
		"p.yml:11:33: capabilities.do_fan.rules[1].max: must be a positive number, got the text \"9\"",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("errors lack %q:\n%s", want, msg)
		}
	}

	// The stricter of a rule and the defaults' share of the range wins.
	p, err := policy.Parse("p.yml", []byte(`physmcp_policy_version: "0.1"
defaults: {max_change_percent: 20}
capabilities:
  do_heater: {rules: [{type: max_change, max: 5.5}]}
  do_fan:    {rules: [{type: max_change, max: 50}]}
`), m)
	if err != nil {
		t.Fatal(err)
	}
	for tool, want := range map[string]policy.MaxChange{
		"do_heater": {Max: 5.5, Source: "policy"}, "do_fan": {Max: 20, Source: "defaults"}, "do_vent": {Max: 20, Source: "defaults"},
	} {
		if got := p.Tools[tool].MaxChange; got == nil || *got != want {
			t.Errorf("%s max_change = %+v, want %+v", tool, got, want)
		}
	}
	out := p.Evaluate(context.Background(), policy.Check{Tool: "do_heater", Value: 50.0, Role: "operator", Now: time.Now()}, policy.NewLimiter(nil), nil)
	if out.Permission != promcp.PermAllowed || out.MaxChange == nil || out.MaxChange.Max != 5.5 {
		t.Errorf("Evaluate must hand the guard to the actuator: %+v", out)
	}
}

func TestApproverRules(t *testing.T) {
	m, err := manifest.Parse("m.yml", []byte(man))
	if err != nil {
		t.Fatal(err)
	}
	bad := `physmcp_policy_version: "0.1"
capabilities:
  do_heater: {rules: [{type: approval, when: always, self_approval: false}]}
  do_fan:    {rules: [{type: approval, when: always, approver_role: viewer}]}
  do_vent:   {rules: [{type: approval, when: always, approver_role: boss}]}
`
	_, err = policy.Parse("p.yml", []byte(bad), m)
	if err == nil {
		t.Fatal("bad approver rules accepted")
	}
	for _, want := range []string{
		"p.yml:3:69: capabilities.do_heater.rules[0].self_approval: self_approval: false needs an approver_role",
		"p.yml:4:69: capabilities.do_fan.rules[0].approver_role: an approver must hold a role that can act (got viewer)",
		`p.yml:5:69: capabilities.do_vent.rules[0].approver_role: unknown role "boss"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("errors lack %q:\n%s", want, err)
		}
	}
	p, err := policy.Parse("p.yml", []byte(`physmcp_policy_version: "0.1"
capabilities:
  do_heater: {rules: [{type: approval, when: always, approver_role: supervisor}]}
  do_fan:    {rules: [{type: approval, when: always, approver_role: supervisor, self_approval: true}]}
  do_vent:   {rules: [{type: approval, when: always}]}
`), m)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tool, caller, role string
		may                bool
	}{
		{"do_heater", "admin", "supervisor", false}, // two-person by default with an approver_role
		{"do_fan", "supervisor", "supervisor", true},
		{"do_fan", "operator", "supervisor", false},
		{"do_vent", "none", "", true},
	} {
		role, may := p.Tools[c.tool].Approval.Approver(c.caller)
		if role != c.role || may != c.may {
			t.Errorf("%s by %s: approver %q, caller may %v", c.tool, c.caller, role, may)
		}
	}
}
