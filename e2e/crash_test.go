package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/store"
)

// TestCrashSafety sends a stream of do_ calls, SIGKILLs the daemon in the
// middle of it and restarts it on the same state. Then it retries every key
// that was sent — acknowledged or in flight at the kill — as an agent
// would: every acknowledged do_ replays identically without touching the
// device; every other key gets an answer in the outcome vocabulary
// (success verified, failed, or partial with a code), and no key reaches
// the device twice: a key the ledger knew at the kill is never written
// again.
func TestCrashSafety(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	d := startHTTP(t, daemonOpts{state: state})
	cs := connectHTTP(t, d, "2026-07-28")

	var (
		mu    sync.Mutex
		acked = map[string]string{} // key -> response text
		sent  = map[string]int{}    // key -> value sent
	)
	tools := []string{"do_fan_zone_b", "do_vent_zone_c", "do_irrigation_valve", "do_heater_zone_c"}
	points := []string{"zone_b.fan", "zone_c.vent", "irrigation_a.command", "zone_c.heater"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("crash-w%d-%04d", w, i)
				value := 10 + i%80
				mu.Lock()
				sent[key] = value
				mu.Unlock()
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tools[w], Arguments: map[string]any{"value": value, "idempotency_key": key}})
				if err != nil || res.IsError {
					return // the daemon died under us: this call was not acknowledged
				}
				mu.Lock()
				acked[key] = text(res)
				mu.Unlock()
			}
		}()
	}
	// Kill once a good number of actuations were acknowledged.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 40 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(acked) < 40 {
		t.Fatalf("only %d actuations acknowledged before the kill", len(acked))
	}

	// What the ledger knew at the kill.
	known := ledgerAtKill(t, state, sent)

	d2 := startHTTP(t, daemonOpts{state: state})
	cs2 := connectHTTP(t, d2, "2026-07-28")
	fresh := map[int]uint64{} // writer -> keys the ledger had never seen
	for key, value := range sent {
		w := int(key[len("crash-w")] - '0')
		if want, ok := acked[key]; ok {
			// Same key, different value: refused as a reused key, not run.
			if res := call(t, cs2, tools[w], map[string]any{"value": 99, "idempotency_key": key}); !res.IsError {
				t.Errorf("%s: reused key with a new value was accepted: %s", key, text(res))
			}
			if got := text(call(t, cs2, tools[w], map[string]any{"value": value, "idempotency_key": key})); got != want {
				t.Errorf("%s: replay after crash differs:\nbefore %s\nafter  %s", key, want, got)
			}
			continue
		}
		res := call(t, cs2, tools[w], map[string]any{"value": value, "idempotency_key": key})
		checkVocabulary(t, key, res)
		if !known[key] {
			fresh[w]++
		}
	}
	s := d2.sim(t)
	for w, p := range points {
		if got := s.writes(p); got != fresh[w] {
			t.Errorf("%s: %d writes after the restart, want %d (one per key the ledger had never seen)", p, got, fresh[w])
		}
	}
	// Across both runs, the audit shows at most one actuation per key,
	// and a key pending at the kill was recovered, not actuated again.
	d2.stop(t)
	counts := auditCounts(t, state)
	for key := range sent {
		c := counts[key]
		if c["do"]+c["recovery"] > 1 {
			t.Errorf("key %s: %d do and %d recovery records", key, c["do"], c["recovery"])
		}
		if _, ok := acked[key]; ok && c["do"] != 1 {
			t.Errorf("acknowledged key %s has %d do records, want 1", key, c["do"])
		}
	}
	t.Logf("%d sent, %d acknowledged before SIGKILL, %d known to the ledger, %d never seen", len(sent), len(acked), len(known), len(sent)-len(known))
}

// ledgerAtKill reports which sent keys the ledger (pending or done) held
// when the daemon died.
func ledgerAtKill(t *testing.T, state string, sent map[string]int) map[string]bool {
	t.Helper()
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	known := map[string]bool{}
	for key := range sent {
		if e, err := st.Lookup(key); err != nil {
			t.Fatal(err)
		} else if e != nil {
			known[key] = true
		}
	}
	return known
}

// checkVocabulary: a do_ answer is success (verified), failed, or partial
// (not verified, with one of the three codes).
func checkVocabulary(t *testing.T, key string, res *mcp.CallToolResult) {
	t.Helper()
	if res.IsError {
		t.Errorf("%s: retry after the crash is a tool error: %s", key, text(res))
		return
	}
	var r struct {
		Status   string `json:"status"`
		Verified bool   `json:"verified"`
		Code     string `json:"code"`
	}
	if err := json.Unmarshal([]byte(text(res)), &r); err != nil {
		t.Fatal(err)
	}
	switch {
	case r.Status == "success" && r.Verified:
	case r.Status == "failed" && !r.Verified:
	case r.Status == "partial" && !r.Verified && (r.Code == "outcome_unknown" || r.Code == "unverified" || r.Code == "mismatch"):
	default:
		t.Errorf("%s: answer outside the outcome vocabulary: %s", key, text(res))
	}
}

// auditCounts counts audit records by key and event over every file.
func auditCounts(t *testing.T, state string) map[string]map[string]int {
	t.Helper()
	counts := map[string]map[string]int{}
	files, _ := filepath.Glob(filepath.Join(state, "audit", "audit*.jsonl"))
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var r struct {
				Event          string `json:"event"`
				IdempotencyKey string `json:"idempotency_key"`
			}
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("audit line is not JSON: %q", sc.Text())
			}
			if counts[r.IdempotencyKey] == nil {
				counts[r.IdempotencyKey] = map[string]int{}
			}
			counts[r.IdempotencyKey][r.Event]++
		}
		f.Close()
	}
	return counts
}
