package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/physd/physd/audit"
)

// TestAuditVerifyCLI: exit 0 and a summary on an intact chain, exit 1 and
// file:line on a broken one, exit 2 on usage errors.
func TestAuditVerifyCLI(t *testing.T) {
	state := t.TempDir()
	dir := filepath.Join(state, "audit")
	l, err := audit.OpenWith(dir, audit.Options{MaxBytes: 700})
	if err != nil {
		t.Fatal(err)
	}
	for range 6 {
		if _, err := l.Append(&audit.Record{Event: "do", Tool: "do_fan", Reason: strings.Repeat("r", 50)}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	code, stdout, stderr := runCLI("audit", "verify", state)
	if code != 0 || !strings.Contains(stdout, "audit chain intact: 6 line(s), seq 1..6") || !strings.Contains(stdout, "head sha256:") {
		t.Fatalf("intact: exit %d\n%s%s", code, stdout, stderr)
	}
	// Change one character of the second line of the current file.
	cur := filepath.Join(dir, "audit.jsonl")
	b, _ := os.ReadFile(cur)
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) < 3 {
		t.Fatalf("want 2+ lines in the current file:\n%s", b)
	}
	lines[0] = strings.Replace(lines[0], "rrr", "rrs", 1)
	os.WriteFile(cur, []byte(strings.Join(lines, "")), 0o640)
	code, _, stderr = runCLI("audit", "verify", state)
	if code != 1 || !strings.Contains(stderr, "audit chain BROKEN at "+cur+":2 (seq") || !strings.Contains(stderr, "altered") {
		t.Errorf("edited: exit %d\n%s", code, stderr)
	}
	if code, _, _ = runCLI("audit", "verify"); code != 2 {
		t.Errorf("no directory: exit %d, want 2", code)
	}
	if code, _, stderr = runCLI("audit", "verify", t.TempDir()); code != 2 || !strings.Contains(stderr, "no audit files") {
		t.Errorf("empty directory: exit %d %s", code, stderr)
	}
}
