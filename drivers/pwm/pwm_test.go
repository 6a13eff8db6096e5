package pwm

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// sysfsChip is a fake /sys/class/pwm/pwmchip0 with channel 0 exported (as
// the kernel lays it out after "echo 0 > export").
func sysfsChip(t *testing.T) string {
	t.Helper()
	chip := filepath.Join(t.TempDir(), "pwmchip0")
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(chip, "pwm0"), 0o755))
	for name, v := range map[string]string{"export": "", "unexport": "", "npwm": "2\n", "pwm0/period": "0\n", "pwm0/duty_cycle": "0\n", "pwm0/enable": "0\n"} {
		must(os.WriteFile(filepath.Join(chip, name), []byte(v), 0o644))
	}
	return chip
}

func file(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func parse(t *testing.T, busCfg, caps string) *manifest.Manifest {
	t.Helper()
	src := `physmcp_version: "0.1"
device: {id: gw_1, type: gateway, location: {zone: z1}}
network: {protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080}], mesh: {}}
buses:
  pwm0: ` + busCfg + `
capabilities:
` + caps
	m, err := manifest.Parse("pwm.yml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

const fanCap = `  - name: fan_speed
    kind: do
    description: Greenhouse circulation fan.
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    tolerance: 0.01
    semantic_tags: [fan, air]
    binding: {type: pwm, bus: pwm0, channel: 0, frequency_hz: 25000, duty_min: 20, duty_max: 100, initial: 0}
`

// TestFanThroughNode: opening sets the period (25 kHz = 40000 ns), the
// initial duty (value 0 = duty_min 20 % = 8000 ns) and enables the
// channel; do_fan_speed 50 writes 60 % (24000 ns) and is verified by the
// kernel's duty_cycle read back; a change made outside physd is what a
// read shows.
func TestFanThroughNode(t *testing.T) {
	chip := sysfsChip(t)
	m := parse(t, "{type: pwm, path: "+chip+"}", fanCap)
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	if p, d, e := file(t, chip+"/pwm0/period"), file(t, chip+"/pwm0/duty_cycle"), file(t, chip+"/pwm0/enable"); p != "40000" || d != "8000" || e != "1" {
		t.Fatalf("after open: period %s duty %s enable %s", p, d, e)
	}
	ctx := context.Background()
	body, err := n.Do(ctx, node.DoRequest{Tool: "do_fan_speed", Value: json.RawMessage(`50`), IdempotencyKey: "k1", Caller: node.Caller{ID: "test", Role: "admin"}})
	if err != nil {
		t.Fatal(err)
	}
	var r promcp.DoResult
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	if r.Status != promcp.StatusSuccess || !r.Verified || r.AppliedValue != 50.0 || r.PreviousValue != 0.0 {
		t.Fatalf("do_fan_speed 50: %s", body)
	}
	if d := file(t, chip+"/pwm0/duty_cycle"); d != "24000" {
		t.Fatalf("duty_cycle %s, want 24000", d)
	}
	if err := os.WriteFile(chip+"/pwm0/duty_cycle", []byte("40000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := n.Read(ctx, "do_fan_speed", 0); err != nil || o.Value != 100.0 {
		t.Fatalf("after an outside change: %+v %v", o, err)
	}
	if err := os.WriteFile(chip+"/pwm0/enable", []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := n.Read(ctx, "do_fan_speed", 0); err != nil || o.Value != 0.0 {
		t.Fatalf("disabled channel: %+v %v", o, err)
	}
}

// TestInvertedDuty: duty_min above duty_max drives a transistor stage that
// inverts the pin: value 0 is duty 80 %, value 25 duty 60 %, and a
// disabled channel (pin low, the load's line pulled high) reads 100.
func TestInvertedDuty(t *testing.T) {
	chip := sysfsChip(t)
	m := parse(t, "{type: pwm, path: "+chip+"}", strings.Replace(fanCap, "duty_min: 20, duty_max: 100", "duty_min: 80, duty_max: 0", 1))
	b, err := drivers.Open(context.Background(), m.Buses["pwm0"])
	if err != nil {
		t.Fatal(err)
	}
	p, err := b.Point(m.Capabilities[0])
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if d := file(t, chip+"/pwm0/duty_cycle"); d != "32000" {
		t.Fatalf("initial 0: duty_cycle %s, want 32000 (80 %% of 40000)", d)
	}
	if err := p.Write(ctx, 25.0); err != nil {
		t.Fatal(err)
	}
	if d := file(t, chip+"/pwm0/duty_cycle"); d != "24000" {
		t.Fatalf("25: duty_cycle %s, want 24000 (60 %%)", d)
	}
	if r, err := p.Read(ctx); err != nil || math.Abs(r.Value.(float64)-25) > 1e-9 {
		t.Fatalf("read back %v %v, want 25", r.Value, err)
	}
	if err := os.WriteFile(chip+"/pwm0/enable", []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Read(ctx); err != nil || r.Value != 100.0 {
		t.Fatalf("disabled: %v %v, want 100", r.Value, err)
	}
}

func TestExportAndErrors(t *testing.T) {
	chip := sysfsChip(t)
	m := parse(t, "{type: pwm, path: "+chip+"}", strings.ReplaceAll(fanCap, "channel: 0", "channel: 1"))
	b, err := drivers.Open(context.Background(), m.Buses["pwm0"])
	if err != nil {
		t.Fatal(err)
	}
	b.(*Bus).exportWait = 50 * time.Millisecond
	_, err = b.Point(m.Capabilities[0])
	if !errors.Is(err, drivers.ErrOffline) || !strings.Contains(err.Error(), "did not appear") || file(t, chip+"/export") != "1" {
		t.Fatalf("export of channel 1: %v (export file %q)", err, file(t, chip+"/export"))
	}

	m = parse(t, "{type: pwm, path: "+chip+"}", fanCap)
	b, _ = drivers.Open(context.Background(), m.Buses["pwm0"])
	p, err := b.Point(m.Capabilities[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(context.Background(), 120.0); !errors.Is(err, drivers.ErrBadValue) {
		t.Fatalf("120 %%: %v", err)
	}
	if v := file(t, chip+"/pwm0/duty_cycle"); v != "8000" {
		t.Fatalf("a refused value wrote duty %s", v)
	}
	if r, err := p.Read(context.Background()); err != nil || math.Abs(r.Value.(float64)) > 1e-9 {
		t.Fatalf("read %v %v", r.Value, err)
	}

	m = parse(t, "{type: pwm, path: /nonexistent/pwmchip7}", fanCap)
	if _, err := drivers.Open(context.Background(), m.Buses["pwm0"]); !errors.Is(err, drivers.ErrOffline) || !strings.Contains(err.Error(), "dtoverlay=pwm") {
		t.Fatalf("missing chip: %v", err)
	}
}

func TestBindingErrors(t *testing.T) {
	for _, c := range []struct{ from, to, want string }{
		{"channel: 0, ", "", "binding.channel: required"},
		{"frequency_hz: 25000", "frequency_hz: 0", "frequency_hz 0 is outside"},
		{", frequency_hz: 25000", "", "binding.frequency_hz: required"},
		{"duty_min: 20", "duty_min: 100", "pwm.yml:15:95: capabilities[0].binding.duty_max: duty_min and duty_max are both 100: every value would drive the same duty"},
		{"duty_min: 20", "duty_min: -5", "pwm.yml:15:80: capabilities[0].binding.duty_min: duty_min -5 is outside 0..100"},
		{"duty_max: 100", "duty_max: 120", "pwm.yml:15:94: capabilities[0].binding.duty_max: duty_max 120 is outside 0..100"},
		{"initial: 0", "initial: 150", "initial 150 is outside 0..100"},
		{"initial: 0", "initial: 0, invert: true", `unknown key "invert"`},
		{"range: {min: 0, max: 100}", "range: {min: 0, max: 255}", "capabilities[0].range: a PWM output takes 0..100"},
		{"data_type: float\n    unit: percent\n    range: {min: 0, max: 100}\n    tolerance: 0.01", "data_type: bool", `capabilities[0].data_type: data_type "bool": a PWM output takes a percentage`},
	} {
		src := strings.Replace(fanCap, c.from, c.to, 1)
		if src == fanCap {
			t.Fatalf("%q not in the capability", c.from)
		}
		m := parse(t, "{type: pwm}", src)
		if err := CheckBinding(m.Capabilities[0]); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s -> %s:\n  err  %v\n  want %q", c.from, c.to, err, c.want)
		}
	}
}
