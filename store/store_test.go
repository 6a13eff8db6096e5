package store

import (
	"strings"
	"testing"
	"time"
)

func TestLedgerLifecycle(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if e, err := s.Begin(LedgerEntry{Key: "a", Tool: "do_x", ArgsHash: "h", Created: now}); e != nil || err != nil {
		t.Fatalf("first Begin: %v %v", e, err)
	}
	e, err := s.Begin(LedgerEntry{Key: "a", Tool: "do_x", ArgsHash: "other", Created: now})
	if err != nil || e == nil || e.State != StatePending || e.ArgsHash != "h" {
		t.Fatalf("second Begin must return the pending entry untouched: %+v %v", e, err)
	}
	if p, _ := s.PendingEntries(); len(p) != 1 {
		t.Fatalf("pending: %v", p)
	}
	if err := s.Complete("a", []byte(`{"status":"success"}`)); err != nil {
		t.Fatal(err)
	}
	// A second process on the same state directory is refused quickly.
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "locked by another physd") {
		t.Errorf("second open: %v", err)
	}
	s.Close()
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, _ = s.Lookup("a")
	if e == nil || e.State != StateDone || string(e.Response) != `{"status":"success"}` {
		t.Fatalf("after reopen: %+v", e)
	}
	if err := s.Complete("missing", nil); err == nil {
		t.Error("Complete of an unknown key must fail")
	}
}

func TestPruneKeepsPendingAndBoundsSize(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10 {
		k := string(rune('a' + i))
		s.Begin(LedgerEntry{Key: k, Tool: "do_x", Created: base.Add(time.Duration(i) * time.Hour)})
		if i != 0 {
			s.Complete(k, []byte("{}"))
		}
	}
	// Everything older than 5 h, except the pending "a", goes.
	n, err := s.Prune(base.Add(5*time.Hour), 1000)
	if err != nil || n != 4 {
		t.Fatalf("prune by age removed %d (%v), want 4", n, err)
	}
	if e, _ := s.Lookup("a"); e == nil {
		t.Error("a pending entry was pruned")
	}
	// Bound to 3 entries: the oldest done ones go first.
	if _, err := s.Prune(base, 3); err != nil {
		t.Fatal(err)
	}
	if got := s.LedgerSize(); got != 3 {
		t.Errorf("size after bounding = %d, want 3", got)
	}
	for _, k := range []string{"a", "i", "j"} {
		if e, _ := s.Lookup(k); e == nil {
			t.Errorf("%s was pruned", k)
		}
	}
}

func TestKV(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, err := s.Get("rate", "x"); v != nil || err != nil {
		t.Fatalf("missing: %q %v", v, err)
	}
	s.Put("rate", "x", []byte("3"))
	if v, _ := s.Get("rate", "x"); string(v) != "3" {
		t.Errorf("got %q", v)
	}
}
