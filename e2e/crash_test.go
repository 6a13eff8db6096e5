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
)

// TestCrashSafety sends a stream of do_ calls, SIGKILLs the daemon in the
// middle of it and restarts it on the same state: every acknowledged do_
// replays identically without touching the device, and no key is ever
// applied twice.
func TestCrashSafety(t *testing.T) {
	state := t.TempDir()
	d := startHTTP(t, daemonOpts{state: state})
	cs := connectHTTP(t, d, "2026-07-28")

	var (
		mu    sync.Mutex
		acked = map[string]string{} // key -> response text
		sent  []string
	)
	tools := []string{"do_fan_zone_b", "do_vent_zone_c", "do_irrigation_valve", "do_heater_zone_c"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("crash-w%d-%04d", w, i)
				mu.Lock()
				sent = append(sent, key)
				mu.Unlock()
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tools[w], Arguments: map[string]any{"value": 10 + i%80, "idempotency_key": key}})
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

	d2 := startHTTP(t, daemonOpts{state: state})
	cs2 := connectHTTP(t, d2, "2026-07-28")
	for key, want := range acked {
		w := key[len("crash-w")] - '0'
		res := call(t, cs2, tools[w], map[string]any{"value": -1, "idempotency_key": key})
		// Same key, different value: must be refused as a reused key, not run.
		if !res.IsError {
			t.Errorf("%s: reused key with a new value was accepted: %s", key, text(res))
		}
		var orig struct {
			Requested any `json:"requested_value"`
		}
		_ = json.Unmarshal([]byte(want), &orig)
		res = call(t, cs2, tools[w], map[string]any{"value": orig.Requested, "idempotency_key": key})
		if got := text(res); got != want {
			t.Errorf("%s: replay after crash differs:\nbefore %s\nafter  %s", key, want, got)
		}
	}
	s := d2.sim(t)
	for _, p := range []string{"zone_b.fan", "zone_c.vent", "irrigation_a.command", "zone_c.heater"} {
		if w := s.writes(p); w != 0 {
			t.Errorf("replaying acknowledged keys wrote %s %d times", p, w)
		}
	}
	// Across both runs, the audit shows at most one actuation per key.
	d2.stop(t)
	counts := map[string]int{}
	f, err := os.Open(filepath.Join(state, "audit", "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			Event          string `json:"event"`
			IdempotencyKey string `json:"idempotency_key"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("audit line is not JSON: %q", sc.Text())
		}
		if r.Event == "do" {
			counts[r.IdempotencyKey]++
		}
	}
	for key, n := range counts {
		if n > 1 {
			t.Errorf("key %s was actuated %d times", key, n)
		}
	}
	for key := range acked {
		if counts[key] != 1 {
			t.Errorf("acknowledged key %s has %d audit records, want 1", key, counts[key])
		}
	}
	t.Logf("%d sent, %d acknowledged before SIGKILL", len(sent), len(acked))
}
