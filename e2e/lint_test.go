package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// lintReport is the part of `physd lint --json` the tests read.
type lintReport struct {
	PromcpVersion   string `json:"promcp_version"`
	Transport       string `json:"transport"`
	ProtocolVersion string `json:"protocol_version"`
	Server          []struct {
		Severity, Code string
	} `json:"server"`
	Tools []struct {
		Name     string
		Findings []struct{ Severity, Code, Message string }
	} `json:"tools"`
	Runtime []struct {
		Tool, Check, Summary string
		Findings             []struct{ Severity, Code, Message string }
	} `json:"runtime"`
	Summary struct {
		Errors, Warnings, Info int
		Pass                   bool
	} `json:"summary"`
}

// runLint runs physd lint and returns its exit code, stdout and stderr.
func runLint(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(physdBin, append([]string{"lint"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

func lintJSON(t *testing.T, wantCode int, args ...string) lintReport {
	t.Helper()
	code, out, errs := runLint(t, append([]string{"--json"}, args...)...)
	if code != wantCode {
		t.Fatalf("physd lint %v: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, code, wantCode, out, errs)
	}
	var r lintReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("lint --json output: %v\n%s", err, out)
	}
	return r
}

func (r lintReport) codes() map[string]int {
	out := map[string]int{}
	for _, f := range r.Server {
		out[f.Code]++
	}
	for _, tl := range r.Tools {
		for _, f := range tl.Findings {
			out[f.Code]++
		}
	}
	for _, rt := range r.Runtime {
		for _, f := range rt.Findings {
			out[f.Code]++
		}
	}
	return out
}

func (r lintReport) checks(tool string) int {
	n := 0
	for _, rt := range r.Runtime {
		if rt.Tool == tool {
			n++
		}
	}
	return n
}

var greenhouseDoPoints = []string{"zone_a.heater", "zone_b.fan", "zone_c.vent", "zone_c.heater", "irrigation_a.command"}

// TestLintGreenhouse: the bundled example passes physd lint with zero
// errors over HTTP (the only warning is S004, 14 tools > 8), every read_
// and the can_do probes are checked, and nothing is actuated.
func TestLintGreenhouse(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	r := lintJSON(t, 0, d.url("/mcp"))
	if r.Summary.Errors != 0 || !r.Summary.Pass || r.ProtocolVersion != "2026-07-28" || r.Transport != "http" {
		t.Fatalf("lint: %+v", r)
	}
	// Allowed warnings: tool density (S004, S005) and promcp-lint's
	// substring match for mutation words in read_ descriptions (D003).
	codes := r.codes()
	if codes["S004"] != 1 || codes["S004"]+codes["S005"]+codes["D003"] != r.Summary.Warnings {
		t.Errorf("warnings other than S004/S005/D003: %v", codes)
	}
	dos := 0
	for _, tl := range r.Tools {
		if strings.HasPrefix(tl.Name, "do_") {
			dos++
		}
	}
	// An anonymous caller without a policy is not listed do_heater_zone_a:
	// the manifest says it requires the operator role.
	if len(r.Tools) != 13 || r.checks("can_do") != dos+2 {
		t.Errorf("%d tools, %d can_do probes for %d do_ tools", len(r.Tools), r.checks("can_do"), dos)
	}
	for _, tl := range r.Tools {
		if strings.HasPrefix(tl.Name, "read_") && r.checks(tl.Name) != 1 {
			t.Errorf("%s was not read", tl.Name)
		}
	}
	st := d.sim(t)
	for _, p := range greenhouseDoPoints {
		if w := st.writes(p); w != 0 {
			t.Errorf("lint without --allow-do wrote %s %d times", p, w)
		}
	}
	// --strict makes the S004 warning fail.
	if code, _, _ := runLint(t, "--strict", d.url("/mcp")); code != 1 {
		t.Errorf("--strict with a warning: exit %d, want 1", code)
	}
	// The human report.
	code, out, _ := runLint(t, d.url("/mcp"))
	if code != 0 || !strings.Contains(out, "✓ can_do") || !strings.Contains(out, "[S004]") || !strings.Contains(out, "0 error(s)") {
		t.Errorf("text report (exit %d):\n%s", code, out)
	}
}

// TestLintAllowDo: with --allow-do each listed do_ is called exactly once,
// with the actuator's current value, so the plant is left as it was. The
// anonymous caller is not listed do_heater_zone_a (the manifest's
// requires_permission holds without a policy), so lint never calls it.
func TestLintAllowDo(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	before := d.sim(t)
	r := lintJSON(t, 0, "--allow-do", d.url("/mcp"))
	after := d.sim(t)
	for _, p := range greenhouseDoPoints {
		want := uint64(1)
		if p == "zone_a.heater" {
			want = 0
		}
		if w := after.writes(p); w != want {
			t.Errorf("%s written %d times, want %d", p, w, want)
		}
		if before.Signals[p] != after.Signals[p] {
			t.Errorf("%s changed from %v to %v", p, before.Signals[p], after.Signals[p])
		}
	}
	n := 0
	for _, rt := range r.Runtime {
		if strings.HasPrefix(rt.Tool, "do_") {
			n++
			if !strings.HasPrefix(rt.Summary, "status success") || len(rt.Findings) != 0 {
				t.Errorf("%s: %s %v", rt.Tool, rt.Summary, rt.Findings)
			}
		}
	}
	if n != 4 {
		t.Errorf("%d do_ checks, want 4", n)
	}
}

func TestLintStdio(t *testing.T) {
	t.Parallel()
	r := lintJSON(t, 0, "--", physdBin, "run", "--manifest", greenhouse, "--stdio", "--state", t.TempDir())
	if r.Transport != "stdio" || r.Summary.Errors != 0 || r.checks("can_do") < 3 {
		t.Errorf("stdio lint: %+v", r)
	}
}

// TestLintWithPolicy: an operator token (--header) sees the heaters as
// candidates; a viewer is not listed the heaters (its role may not run
// them), so lint probes none; an unknown token cannot connect (exit 2).
func TestLintWithPolicy(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	anon := lintJSON(t, 0, "--header", "Authorization: Bearer "+viewerToken, d.url("/mcp"))
	op := lintJSON(t, 0, "--header", "Authorization: Bearer "+operatorToken, d.url("/mcp"))
	find := func(r lintReport, check string) string {
		for _, rt := range r.Runtime {
			if rt.Check == check {
				return rt.Summary
			}
		}
		return ""
	}
	const heater = "intent heater set heater_zone_a"
	if s := find(anon, heater); s != "" {
		t.Errorf("viewer heater probe: %q; the viewer must not be listed the heater", s)
	}
	for _, rt := range anon.Runtime {
		if strings.HasPrefix(rt.Tool, "do_heater") {
			t.Errorf("the viewer's lint checked %s, a tool its role may not run", rt.Tool)
		}
	}
	if s := find(op, heater); !strings.Contains(s, "feasible=true") || !strings.Contains(s, "do_heater_zone_a(allowed)") {
		t.Errorf("operator heater probe: %q", s)
	}
	if code, _, errs := runLint(t, "--header", "Authorization: Bearer not-a-token", d.url("/mcp")); code != 2 || !strings.Contains(errs, "Unauthorized") {
		t.Errorf("unknown token: exit %d, %s", code, errs)
	}
}

func TestLintFileAndErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "tools.json")
	tools := `{"tools": [
	  {"name": "getTemperature", "description": "Temperature.", "inputSchema": {"type": "object"}},
	  {"name": "do_fan", "description": "Set the fan speed in percent.", "inputSchema": {"type": "object", "properties": {"value": {}}},
	   "responseSchema": {"properties": {"status": {"enum": ["success", "done"]}, "timestamp": {}}}}]}`
	if err := os.WriteFile(file, []byte(tools), 0o644); err != nil {
		t.Fatal(err)
	}
	r := lintJSON(t, 1, file)
	codes := r.codes()
	for _, want := range []string{"N002", "N003", "D002", "R000", "I003", "R004", "R005", "R006", "R007", "R008", "S001"} {
		if codes[want] == 0 {
			t.Errorf("%s not reported: %v", want, codes)
		}
	}
	if r.Transport != "file" || len(r.Runtime) != 0 {
		t.Errorf("a file gets static rules only: %+v", r)
	}
	if code, _, _ := runLint(t, filepath.Join(dir, "missing.json")); code != 2 {
		t.Errorf("missing file: exit %d, want 2", code)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if code, _, errs := runLint(t, "--timeout", "5s", "http://"+addr+"/mcp"); code != 2 || !strings.Contains(errs, "cannot connect") {
		t.Errorf("nothing listening: exit %d, %s", code, errs)
	}
	if code, _, _ := runLint(t); code != 2 {
		t.Errorf("no target: exit %d, want 2", code)
	}
}
