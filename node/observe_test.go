package node_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// polledHeater reads zone A's heater power (which do_heater_zone_a sets)
// every second, with a 5 % deadband.
const polledHeater = `  - name: heater_power_zone_a
    kind: read
    description: Heater power in zone A as the controller reports it.
    zone: zone_a
    binding: {type: sim, bus: plant, point: zone_a.heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [heater, power, zone_a]
    poll_ms: 1000
    deadband: 5
`

func openWith(t testing.TB, text string) *fixture {
	t.Helper()
	m, err := manifest.Parse("test.yml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{n: n, st: st, al: al, dir: dir}
	t.Cleanup(f.close)
	return f
}

// next returns the next observation of capability name on sub, skipping
// other capabilities', or fails when none is waiting.
func next(t *testing.T, sub *node.Subscription, name string) node.Observed {
	t.Helper()
	for {
		select {
		case o := <-sub.C:
			if o.Cap.Name == name {
				return o
			}
		default:
			t.Fatalf("no observation of %s waiting", name)
		}
	}
}

func drain(sub *node.Subscription) {
	for {
		select {
		case <-sub.C:
		default:
			return
		}
	}
}

// TestObservationStream: background polls publish an observation every
// poll_ms; a move inside the deadband is published but not a change, one
// beyond it is; a do_ publishes its reads too; a subscriber that falls
// behind loses observations, counted, and never slows the node; Close ends
// polls and subscriptions.
func TestObservationStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openWith(t, testManifest+polledHeater)
		sub := f.n.Subscribe(64)
		time.Sleep(1001 * time.Millisecond)
		synctest.Wait()
		o := next(t, sub, "heater_power_zone_a")
		if !o.Changed || o.Obs.Quality != promcp.QualityGood || o.Obs.Value != 0.0 || o.Obs.Capability != "read_heater_power_zone_a" {
			t.Fatalf("first poll: %+v", o)
		}

		if r := do(t, f.n, "do_heater_zone_a", 3, "k1"); r.Status != promcp.StatusSuccess {
			t.Fatalf("do: %+v", r)
		}
		if o := next(t, sub, "heater_zone_a"); o.Obs.Capability != "do_heater_zone_a" {
			t.Fatalf("do_ read: %+v", o)
		}
		drain(sub)
		time.Sleep(time.Second)
		synctest.Wait()
		if o := next(t, sub, "heater_power_zone_a"); o.Changed || o.Obs.Value != 3.0 {
			t.Fatalf("3 %% is inside the 5 %% deadband, yet: %+v", o)
		}
		do(t, f.n, "do_heater_zone_a", 7, "k2") // 7 − 0 > 5: the reference is the last change, not the last poll
		drain(sub)
		time.Sleep(time.Second)
		synctest.Wait()
		if o := next(t, sub, "heater_power_zone_a"); !o.Changed || o.Obs.Value != 7.0 {
			t.Fatalf("7 is beyond the deadband from 0: %+v", o)
		}

		slow := f.n.Subscribe(1)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if slow.Dropped() != 2 || f.n.ObservationsDropped() != 2 {
			t.Fatalf("dropped = %d (total %d), want 2", slow.Dropped(), f.n.ObservationsDropped())
		}
		slow.Close()
		<-slow.Done()

		f.n.Close(context.Background())
		<-sub.Done()
		drain(sub)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		select {
		case o := <-sub.C:
			t.Fatalf("poll after Close: %+v", o)
		default:
		}
	})
}
