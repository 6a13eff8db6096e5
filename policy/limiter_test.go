package policy_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/physd/physd/policy"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// TestReserveIsOneStepUnderConcurrency: of 20 concurrent real calls on a
// 3/min tool, exactly 3 leave with a slot; a released slot is free again;
// after a restart only begun slots count.
func TestReserveIsOneStepUnderConcurrency(t *testing.T) {
	_, p := load(t, pol)
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	lim := policy.NewLimiter(st)
	noon := ams(t, "2026-06-10 12:00")
	check := policy.Check{Tool: "do_heater", Value: 50.0, Role: "operator", Now: noon, Reserve: true}
	var mu sync.Mutex
	var slots []*policy.Reservation
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := p.Evaluate(context.Background(), check, lim, nil)
			if o.Permission == promcp.PermAllowed {
				mu.Lock()
				slots = append(slots, o.Slot)
				mu.Unlock()
			} else if o.Permission != promcp.PermRateLimited || o.Slot != nil {
				t.Errorf("refused call: %+v", o)
			}
		}()
	}
	wg.Wait()
	if len(slots) != 3 {
		t.Fatalf("%d calls got a slot of a 3/min limit", len(slots))
	}
	// Begin two (persisted, as the node does in its ledger commit); give
	// the third back: one more call fits.
	for _, s := range slots[:2] {
		k, v := s.Begin(noon)
		if err := st.Put(policy.StateBucket, k, v); err != nil {
			t.Fatal(err)
		}
	}
	if _, v := slots[2].Release(); v != nil {
		t.Error("releasing a slot that never began asked for a write")
	}
	if o := p.Evaluate(context.Background(), check, lim, nil); o.Permission != promcp.PermAllowed {
		t.Fatalf("after a release: %+v", o)
	}
	// A restart sees the two begun slots and the new reserved one is gone:
	// one more call fits, then the limit.
	st.Close()
	st, _ = store.Open(dir)
	defer st.Close()
	lim = policy.NewLimiter(st)
	check.Now = noon.Add(time.Second)
	if o := p.Evaluate(context.Background(), check, lim, nil); o.Permission != promcp.PermAllowed {
		t.Fatalf("after restart, third call: %+v", o)
	}
	if o := p.Evaluate(context.Background(), check, lim, nil); o.Permission != promcp.PermRateLimited {
		t.Fatalf("after restart, fourth call: %+v", o)
	}
	// A slot released after it began rewrites the history without it.
	o := p.Evaluate(context.Background(), policy.Check{Tool: "do_heater", Value: 50.0, Role: "operator", Now: noon.Add(2 * time.Minute), Reserve: true}, lim, nil)
	o.Slot.Begin(noon.Add(2 * time.Minute))
	if _, v := o.Slot.Release(); v == nil || string(v) == "" {
		t.Error("releasing a begun slot must return the history to persist")
	}
}
