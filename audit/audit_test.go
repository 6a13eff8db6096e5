package audit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAppendResumeAndTornLine(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := l.Append(&Record{Event: "do", Tool: "do_x"}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	// A crash mid-write leaves half a line.
	f, _ := os.OpenFile(filepath.Join(dir, "audit.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"seq":4,"event":"do","to`)
	f.Close()

	l, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	seq, err := l.Append(&Record{Event: "do", Tool: "do_y"})
	if err != nil || seq != 4 {
		t.Fatalf("seq after reopen = %d (%v), want 4", seq, err)
	}
	var tools []string
	l.Scan(func(r Record) bool { tools = append(tools, r.Tool); return true })
	l.Close()
	if got := strings.Join(tools, ","); got != "do_x,do_x,do_x,do_y" {
		t.Errorf("records = %s", got)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "audit.jsonl"))
	if strings.Contains(string(b), `"to`+"\n") || strings.Count(string(b), "\n") != 4 {
		t.Errorf("torn line not cut:\n%s", b)
	}
	if _, err := l.Append(&Record{}); err == nil {
		t.Error("append after close must fail")
	}
}
