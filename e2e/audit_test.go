package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAuditChainVerify: the trail physd writes across a restart verifies
// with `physd audit verify`; one changed byte in it is found at its line.
func TestAuditChainVerify(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	for run := range 2 {
		d := startHTTP(t, daemonOpts{state: state})
		cs := connectHTTP(t, d, "2026-07-28")
		for i := range 3 {
			r := structured(t, call(t, cs, "do_fan_zone_b", map[string]any{"value": 10*run + i, "idempotency_key": fmt.Sprintf("chain-%d-%d", run, i)}))
			if r["status"] != "success" {
				t.Fatalf("do_: %v", r)
			}
		}
		cs.Close()
		d.stop(t)
	}
	verify := func() (int, string) {
		out, err := exec.Command(physdBin, "audit", "verify", state).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(out)
	}
	code, out := verify()
	if code != 0 || !strings.Contains(out, "audit chain intact") || !strings.Contains(out, "from the trail's first line") {
		t.Fatalf("intact trail: exit %d\n%s", code, out)
	}
	// Rewrite the applied value of the second do_ line.
	path := filepath.Join(state, "audit", "audit.jsonl")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	n := 0
	for i, l := range lines {
		if strings.Contains(l, `"event":"do"`) {
			if n++; n == 2 {
				lines[i] = strings.Replace(l, `"applied_value":1,`, `"applied_value":100,`, 1)
				if lines[i] == l {
					t.Fatalf("no applied_value 1 in %s", l)
				}
				n = i + 2 // the line after it carries the broken link
				break
			}
		}
	}
	os.WriteFile(path, []byte(strings.Join(lines, "")), 0o640)
	code, out = verify()
	if code != 1 || !strings.Contains(out, fmt.Sprintf("audit chain BROKEN at %s:%d", path, n)) {
		t.Errorf("edited trail: exit %d\n%s", code, out)
	}
}
