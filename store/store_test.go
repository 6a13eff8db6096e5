package store

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func entry(key string, at time.Time) LedgerEntry {
	return LedgerEntry{Key: key, Tool: "do_x", ArgsHash: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", Created: at}
}

func TestLedgerLifecycle(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if e, err := s.Begin(entry("a", now), nil); e != nil || err != nil {
		t.Fatalf("first Begin: %v %v", e, err)
	}
	other := entry("a", now)
	other.ArgsHash = "other"
	e, err := s.Begin(other, nil)
	if err != nil || e == nil || e.State != StatePending || e.ArgsHash != entry("a", now).ArgsHash {
		t.Fatalf("second Begin must return the pending entry untouched: %+v %v", e, err)
	}
	if p, _ := s.PendingEntries(); len(p) != 1 {
		t.Fatalf("pending: %v", p)
	}
	done := entry("a", now)
	done.Response = []byte(`{"status":"success"}`)
	if err := s.Complete(done); err != nil {
		t.Fatal(err)
	}
	// A second process on the same state directory is refused quickly.
	// It names the holder's PID and the fix.
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "locked by another physd") ||
		!strings.Contains(err.Error(), fmt.Sprintf("(PID %d, from %s)", os.Getpid(), filepath.Join(dir, OwnerFile))) ||
		!strings.Contains(err.Error(), "--state DIR") {
		t.Errorf("second open: %v", err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, OwnerFile)); !os.IsNotExist(err) {
		t.Errorf("%s outlives the physd that wrote it: %v", OwnerFile, err)
	}
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, _ = s.Lookup("a")
	if e == nil || e.State != StateDone || string(e.Response) != `{"status":"success"}` || e.ArgsHash != done.ArgsHash || !e.Created.Equal(now) {
		t.Fatalf("after reopen: %+v", e)
	}
	if p, _ := s.PendingEntries(); len(p) != 0 {
		t.Fatalf("still pending: %v", p)
	}
	if err := s.Complete(entry("missing", now)); err == nil {
		t.Error("Complete of an unknown key must fail")
	}
}

// TestDeferredCompleteIsServedAndWrittenWithTheNextCommit: an answer made
// durable elsewhere is visible at once and reaches the database with the
// next transaction, not with a sync of its own.
func TestDeferredCompleteIsServedAndWrittenWithTheNextCommit(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	s.Begin(entry("a", now), nil)
	a := entry("a", now)
	a.Response = []byte(`{"status":"success","n":1}`)
	s.CompleteDeferred(a)
	if e, _ := s.Lookup("a"); e == nil || e.State != StateDone || string(e.Response) != string(a.Response) {
		t.Fatalf("deferred answer not served: %+v", e)
	}
	if e, _ := s.Begin(entry("a", now), nil); e == nil || e.State != StateDone {
		t.Fatalf("Begin of a deferred key must return it: %+v", e)
	}
	// The next Begin writes it.
	if e, err := s.Begin(entry("b", now), nil); e != nil || err != nil {
		t.Fatal(e, err)
	}
	if n := s.deferredCount(); n != 0 {
		t.Fatalf("%d answers still deferred after a commit", n)
	}
	if p, _ := s.PendingEntries(); len(p) != 1 || p[0].Key != "b" {
		t.Fatalf("pending after the commit: %+v", p)
	}
	// Close writes what is left.
	b := entry("b", now)
	b.Response = []byte(`{"status":"partial"}`)
	s.CompleteDeferred(b)
	s.Close()
	s, _ = Open(dir)
	defer s.Close()
	for k, want := range map[string]string{"a": string(a.Response), "b": string(b.Response)} {
		if e, _ := s.Lookup(k); e == nil || string(e.Response) != want {
			t.Errorf("%s after reopen: %+v", k, e)
		}
	}
}

func TestForgetRunsExtraInTheSameCommit(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Begin(entry("a", time.Now()), func() []KV { return []KV{{"rate", "do_x", []byte("1")}} })
	if v, _ := s.Get("rate", "do_x"); string(v) != "1" {
		t.Fatalf("extra not written with Begin: %q", v)
	}
	s.Forget("a", func() []KV { return []KV{{"rate", "do_x", nil}} })
	if e, _ := s.Lookup("a"); e != nil {
		t.Errorf("forgotten key still there: %+v", e)
	}
	if v, _ := s.Get("rate", "do_x"); v != nil {
		t.Errorf("extra delete not applied: %q", v)
	}
}

func completed(t *testing.T, s *Store, key string, at time.Time, body []byte) {
	t.Helper()
	if _, err := s.Begin(entry(key, at), nil); err != nil {
		t.Fatal(err)
	}
	e := entry(key, at)
	e.Response = body
	if err := s.Complete(e); err != nil {
		t.Fatal(err)
	}
}

func TestPruneKeepsADayAndPendingAndBoundsOlderKeys(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC)
	// 10 keys, one every 6 h back from now: 0 h, 6 h, … 54 h old.
	for i := range 10 {
		completed(t, s, fmt.Sprint("k", i), now.Add(-time.Duration(i)*6*time.Hour), []byte("{}"))
	}
	s.Begin(entry("pending", now.Add(-100*time.Hour)), nil)
	// Window 48 h: keys older than 48 h (k9 at 54 h) go.
	if n, err := s.Prune(PruneOptions{Now: now, Window: 48 * time.Hour}); err != nil || n != 1 {
		t.Fatalf("prune by age removed %d (%v), want 1", n, err)
	}
	// A bound of 2 keys evicts only keys older than 24 h (k5..k8); the
	// five younger ones stay even though that is over the bound.
	if n, err := s.Prune(PruneOptions{Now: now, Window: 48 * time.Hour, MaxKeys: 2, Batch: 2}); err != nil || n != 4 {
		t.Fatalf("prune by count removed %d (%v), want 4", n, err)
	}
	if st := s.LedgerStats(); st.Keys != 5 || st.Pending != 1 {
		t.Errorf("stats after bounding: %+v", st)
	}
	for _, k := range []string{"k0", "k4", "pending"} {
		if e, _ := s.Lookup(k); e == nil {
			t.Errorf("%s was pruned", k)
		}
	}
	if e, _ := s.Lookup("k5"); e != nil {
		t.Errorf("k5 (30 h old) survived a bound of 2 keys")
	}
}

// TestCompactRecordsAreSmall: a typical do_ answer costs well under the
// 600 bytes a key the ledger is sized for.
func TestCompactRecordsAreSmall(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	body := typicalAnswer("7f9c2b1e-0d4e-4f61-9a55-2f1f4cbd1c20", 17)
	completed(t, s, "7f9c2b1e-0d4e-4f61-9a55-2f1f4cbd1c20", time.Now(), body)
	st := s.LedgerStats()
	if st.Bytes > 450 {
		t.Errorf("one key of a %d-byte answer costs %d bytes", len(body), st.Bytes)
	}
	e, _ := s.Lookup("7f9c2b1e-0d4e-4f61-9a55-2f1f4cbd1c20")
	if e == nil || string(e.Response) != string(body) {
		t.Fatalf("replay is not byte for byte")
	}
}

func typicalAnswer(key string, seq int) []byte {
	hint := "do_heater_zone_a value=0"
	b, _ := json.Marshal(map[string]any{
		"status": "success", "idempotency_key": key, "compensable": true, "compensation_hint": hint,
		"timestamp": "2026-12-01T10:11:12.123456789Z", "applied_value": 60, "previous_value": 0,
		"side_effects": []string{"zone_a_temperature_change", "energy_consumption"},
		"capability":   "do_heater_zone_a", "source": "greenhouse_gw_01", "requested_value": 60, "verified": true,
		"permission": "allowed",
		"policy":     map[string]any{"configured": false, "decision": "not_evaluated", "note": "no physmcp.policy.yml is configured: only the manifest's data type and range were enforced; its rate_limit, requires_permission, cooldown_ms and requires_quorum are not enforced and no approval gate ran"},
		"audit":      map[string]any{"seq": seq},
	})
	return b
}

// TestMigratesTheLegacyLedger: a state directory written by physd ≤ 0.1
// (JSON entries by key) opens with every key intact.
func TestMigratesTheLegacyLedger(t *testing.T) {
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "physd.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	db.Update(func(tx *bolt.Tx) error {
		b, _ := tx.CreateBucket(bucketLegacyLedger)
		tx.CreateBucket(bucketLegacyByTime)
		for _, e := range []LedgerEntry{
			{Key: "done", Tool: "do_x", ArgsHash: "abc", State: StateDone, Created: now, Response: json.RawMessage(`{"status":"success"}`)},
			{Key: "pend", Tool: "do_x", ArgsHash: "abc", State: StatePending, Created: now, Pending: json.RawMessage(`{"value":1}`)},
		} {
			v, _ := json.Marshal(e)
			b.Put([]byte(e.Key), v)
		}
		return nil
	})
	db.Close()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if e, _ := s.Lookup("done"); e == nil || e.State != StateDone || string(e.Response) != `{"status":"success"}` || e.ArgsHash != "abc" {
		t.Errorf("done after migration: %+v", e)
	}
	if p, _ := s.PendingEntries(); len(p) != 1 || p[0].Key != "pend" {
		t.Errorf("pending after migration: %+v", p)
	}
}

// TestCompactsASparseFileAtOpen: after a burst is pruned the file is
// mostly free pages; the next start gives the space back.
func TestCompactsASparseFileAtOpen(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~20 MB")
	}
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-72 * time.Hour)
	// 12 MB of incompressible answers, written in one transaction.
	err = s.db.Update(func(tx *bolt.Tx) error {
		for i := range 4000 {
			e := entry(fmt.Sprint("burst-", i), old.Add(time.Duration(i)))
			e.Response = []byte(fmt.Sprintf(`{"p":"%x"}`, randomBytes(t, 1500)))
			if err := putDone(tx, &e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prune(PruneOptions{Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	completed(t, s, "survivor", time.Now(), []byte(`{"ok":true}`))
	s.Close()
	before := fileSize(t, dir)
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	after := fileSize(t, dir)
	if before < compactMinFile || after > before/4 {
		t.Errorf("file %d bytes before the compacting open, %d after", before, after)
	}
	if e, _ := s.Lookup("survivor"); e == nil || string(e.Response) != `{"ok":true}` {
		t.Errorf("survivor lost in compaction: %+v", e)
	}
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func fileSize(t *testing.T, dir string) int64 {
	fi, err := os.Stat(filepath.Join(dir, "physd.db"))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
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

// TestUncleanStop: a state directory whose last run closed its store
// reports a clean stop; one whose run ended without Close (here: the
// database file as a SIGKILL leaves it, copied while the store is open)
// reports the run that did not stop, with its pid and start time.
func TestUncleanStop(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.UncleanStop() != nil {
		t.Fatalf("a new state directory: unclean stop %+v", s.UncleanStop())
	}
	killed := t.TempDir()
	raw, err := os.ReadFile(filepath.Join(dir, "physd.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(killed, "physd.db"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.UncleanStop() != nil {
		t.Fatalf("after a clean stop: unclean stop %+v", s.UncleanStop())
	}
	s.Close()

	k, err := Open(killed)
	if err != nil {
		t.Fatal(err)
	}
	prev := k.UncleanStop()
	if prev == nil || prev.PID != os.Getpid() || time.Since(prev.Started) > time.Minute {
		t.Fatalf("after a run that did not close: unclean stop %+v; want this process's run", prev)
	}
	k.Close()
	if k, err = Open(killed); err != nil || k.UncleanStop() != nil {
		t.Fatalf("the restart stopped cleanly: %v, %+v", err, k.UncleanStop())
	}
	k.Close()
}
