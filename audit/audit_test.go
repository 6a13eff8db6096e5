package audit

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"
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

func TestRotationAndRetention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		l, err := OpenWith(dir, Options{MaxBytes: 400, RetentionDays: 3})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		// Day 1: enough records to rotate by size twice.
		for range 9 {
			if _, err := l.Append(&Record{Event: "do", Tool: "do_fan", Reason: strings.Repeat("x", 60)}); err != nil {
				t.Fatal(err)
			}
		}
		day1 := time.Now().UTC().Format(time.DateOnly)
		if _, err := os.Stat(filepath.Join(dir, "audit-"+day1+".jsonl")); err != nil {
			t.Fatalf("no size rotation: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "audit-"+day1+".1.jsonl")); err != nil {
			t.Fatalf("no second size rotation: %v", err)
		}
		// Each new day rotates; files past 3 days are deleted.
		for range 5 {
			time.Sleep(24 * time.Hour)
			l.Append(&Record{Event: "do", Tool: "do_fan"})
		}
		if _, err := os.Stat(filepath.Join(dir, "audit-"+day1+".jsonl")); !os.IsNotExist(err) {
			t.Errorf("day-1 file outlived the 3-day retention: %v", err)
		}
		names, _ := filepath.Glob(filepath.Join(dir, "audit-*.jsonl"))
		if len(names) != 3 {
			t.Errorf("rotated files kept: %v, want the last 3 days", names)
		}
		// Scan still sees every record kept, in order.
		var seqs []uint64
		l.Scan(func(r Record) bool { seqs = append(seqs, r.Seq); return true })
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				t.Fatalf("scan out of order: %v", seqs)
			}
		}
		if seqs[len(seqs)-1] != 14 {
			t.Errorf("last seq %d, want 14", seqs[len(seqs)-1])
		}
	})
}

func TestRemoteSinkNeverBlocks(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	defer srv.Close()
	defer close(block)
	sink, err := NewRemoteSink("http", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	l, err := OpenWith(t.TempDir(), Options{Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		for range 2000 {
			if _, err := l.Append(&Record{Event: "do"}); err != nil {
				t.Error(err)
			}
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("appends blocked on a hung remote sink")
	}
	if sink.Dropped.Load() == 0 {
		t.Error("a hung sink should overflow its queue and drop, not block")
	}
	if _, err := NewRemoteSink("mqtt", "x"); err == nil {
		t.Error("mqtt accepted")
	}
}
