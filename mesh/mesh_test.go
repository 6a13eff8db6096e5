package mesh

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/mesh/meshtest"
)

// Three nodes join, exchange catalogs, answer requests with correlation,
// and a fan-out drops (and counts) the answer of a node slower than the
// deadline.
func TestJoinCatalogsRequestFanout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 3, 1, nil)
		defer c.close()
		all := c.names()
		took := waitFor(t, 30*time.Second, "3 nodes converge", func() bool { return c.converged(all) })
		report(t, "3-node join + catalogs converged in %v simulated", took)
		n1, n2 := c.nodes["n1"], c.nodes["n2"]

		cats := n1.Catalogs()
		if len(cats) != 3 {
			t.Fatalf("n1 catalogs = %v", cats)
		}
		if e, ok := cats["n2"].Find("read_temperature_n2"); !ok || e.Unit != "celsius" || *e.Max != 50 || cats["n2"].Zone != "zone_n2" {
			t.Errorf("n2 catalog as seen by n1 = %+v", cats["n2"])
		}
		if want := testCatalog("n2").Canonical().Hash; cats["n2"].Hash != want {
			t.Errorf("hash %s, want %s", cats["n2"].Hash, want)
		}
		if got := n1.PartitionState(); got != Healthy {
			t.Errorf("partition state %s", got)
		}
		if got := n1.SizeEstimate(); got != 3 {
			t.Errorf("size estimate %d", got)
		}

		ctx := context.Background()
		out, err := n1.Request(ctx, "n2", "echo", []byte("hi"))
		if err != nil || string(out) != "n2:hi" {
			t.Fatalf("echo = %q, %v", out, err)
		}
		// Correlation: many concurrent requests, each gets its own reply.
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				to := []string{"n2", "n3"}[i%2]
				p := fmt.Sprint(i)
				out, err := n1.Request(ctx, to, "echo", []byte(p))
				if err != nil || string(out) != to+":"+p {
					t.Errorf("request %d to %s = %q, %v", i, to, out, err)
				}
			})
		}
		wg.Wait()
		// Self request goes straight to the handler.
		if out, err := n1.Request(ctx, "n1", "echo", []byte("me")); err != nil || string(out) != "n1:me" {
			t.Errorf("self echo = %q, %v", out, err)
		}

		// Errors.
		_, err = n1.Request(ctx, "n2", "fail", nil)
		var re *RemoteError
		if !errors.As(err, &re) || re.Node != "n2" || re.Kind != "fail" || re.Msg != "boom on n2" {
			t.Errorf("remote error = %v", err)
		}
		if _, err := n1.Request(ctx, "n2", "panic", nil); !errors.As(err, &re) || !strings.Contains(re.Msg, "handler panic") {
			t.Errorf("panic = %v", err)
		}
		if _, err := n1.Request(ctx, "n2", "big", nil); !errors.As(err, &re) || !strings.Contains(re.Msg, "over the") {
			t.Errorf("big reply = %v", err)
		}
		if _, err := n1.Request(ctx, "n9", "echo", nil); !errors.Is(err, ErrUnknownNode) {
			t.Errorf("unknown node = %v", err)
		}
		if _, err := n1.Request(ctx, "n2", "echo", make([]byte, MaxPayload+1)); !errors.Is(err, ErrTooLarge) {
			t.Errorf("too large = %v", err)
		}
		// Default deadline (no ctx deadline) = RequestTimeout.
		start := time.Now()
		if _, err := n1.Request(ctx, "n3", "slow", nil); !errors.Is(err, ErrTimeout) || time.Since(start) != DefaultRequestTimeout {
			t.Errorf("slow request = %v after %v", err, time.Since(start))
		}

		// Fan-out with n3 slower than the deadline.
		time.Sleep(5 * time.Second) // let the earlier late reply land
		lateBefore := n1.LateDropped()
		fctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		start = time.Now()
		replies, errs, late := n1.Fanout(fctx, all, "slow", nil)
		elapsed := time.Since(start)
		cancel()
		if elapsed != 500*time.Millisecond {
			t.Errorf("fanout returned after %v, want at the 500ms deadline", elapsed)
		}
		if len(replies) != 2 || string(replies["n1"]) != "n1" || string(replies["n2"]) != "n2" {
			t.Errorf("replies = %q", replies)
		}
		if len(errs) != 1 || !errors.Is(errs["n3"], ErrTimeout) {
			t.Errorf("errs = %v", errs)
		}
		if late.Load() != 0 {
			t.Errorf("late before n3 answered = %d", late.Load())
		}
		time.Sleep(3 * time.Second)
		if late.Load() != 1 || n1.LateDropped()-lateBefore != 1 {
			t.Errorf("late = %d (total +%d), want 1", late.Load(), n1.LateDropped()-lateBefore)
		}
		report(t, "fanout to 3 (n3 sleeps 2s): returned at %v, %d replies, late counted %d", elapsed, len(replies), late.Load())

		// Catalog update propagates (hash in meta → fetch) and fires OnChange.
		var changes atomic.Int32
		n2.OnChange(func() { changes.Add(1) })
		cat := testCatalog("n1")
		cat.Capabilities = append(cat.Capabilities, CatalogEntry{Tool: "read_humidity_n1", Kind: "read", Unit: "percent"})
		if err := n1.UpdateCatalog(cat); err != nil {
			t.Fatal(err)
		}
		took = waitFor(t, 30*time.Second, "updated catalog reaches n2", func() bool {
			_, ok := n2.Catalogs()["n1"].Find("read_humidity_n1")
			return ok
		})
		report(t, "catalog update seen by a peer after %v simulated", took)
		synctest.Wait() // OnChange runs asynchronously
		if changes.Load() == 0 {
			t.Error("OnChange not called")
		}

		// Graceful leave: others see "left", not "dead".
		n3 := c.nodes["n3"]
		if err := n3.Leave(time.Second); err != nil {
			t.Fatal(err)
		}
		_ = n3.Shutdown()
		waitFor(t, 10*time.Second, "n3 left", func() bool { return state(n1, "n3") == StateLeft && state(n2, "n3") == StateLeft })
		if _, err := n1.Request(ctx, "n3", "echo", nil); !errors.Is(err, ErrNodeNotAlive) {
			t.Errorf("request to left node = %v", err)
		}
		// Expected 3, alive 2, left 1: majority is there, nothing suspect.
		if got := n1.PartitionState(); got != Healthy {
			t.Errorf("after a graceful leave: %s", got)
		}
	})
}

// A crashed node goes suspect → dead; Quorum reflects the crash within
// RequestTimeout, long before failure detection.
func TestCrash(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("of%d", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCluster(t, n, uint64(n), nil)
				defer c.close()
				all := c.names()
				waitFor(t, 60*time.Second, "converge", func() bool { return c.converged(all) })
				time.Sleep(5 * time.Second)
				n1 := c.nodes["n1"]
				if q := n1.Quorum(context.Background(), 0); q != n {
					t.Fatalf("quorum before crash = %d", q)
				}

				victim := name(n)
				c.net.Crash(victim)
				crashed := time.Now()

				// Fresh acks: decided at RequestTimeout, not after detection.
				q := n1.Quorum(context.Background(), n)
				qTook := time.Since(crashed)
				if q != n-1 || qTook > n1.cfg.RequestTimeout {
					t.Errorf("quorum right after crash = %d after %v, want %d within %v", q, qTook, n-1, n1.cfg.RequestTimeout)
				}
				err := n1.RequireQuorum(context.Background(), n)
				if err == nil || err.Error() != fmt.Sprintf("partition_no_quorum: alive %d, required %d", n-1, n) {
					t.Errorf("RequireQuorum(%d) = %v", n, err)
				}
				if err := n1.RequireQuorum(context.Background(), 0); err != nil {
					t.Errorf("majority still reachable: %v", err)
				}

				// memberlist's own detection on the survivors other than n1
				// (n1's failed quorum ack already marked it suspect).
				var others []string
				for _, s := range all[1 : n-1] {
					others = append(others, s)
				}
				var suspectAt, deadAt time.Duration
				sawSuspect := false
				waitFor(t, 60*time.Second, victim+" dead everywhere", func() bool {
					dead := true
					for _, s := range all[:n-1] {
						st := state(c.nodes[s], victim)
						if st == StateSuspect && !sawSuspect && s != "n1" {
							sawSuspect, suspectAt = true, time.Since(crashed)
						}
						if st != StateDead {
							dead = false
						}
					}
					if dead {
						deadAt = time.Since(crashed)
					}
					return dead
				})
				if !sawSuspect {
					t.Errorf("no survivor among %v reported %s suspect before dead", others, victim)
				}
				report(t, "crash 1 of %d (LAN profile): quorum decided in %v (alive %d); first suspect (memberlist probe) at %v; dead on all %d survivors at %v simulated",
					n, qTook, q, suspectAt, n-1, deadAt)
				for _, s := range all[:n-1] {
					waitFor(t, 2*DefaultPartitionHold, s+" reports suspected_partition", func() bool {
						return c.nodes[s].PartitionState() == SuspectedPartition
					})
				}
			})
		})
	}
}

// A 3|2 partition: the minority fails quorum at once and reports
// partitioned; the majority proceeds; after a long partition, the
// reconnect loop re-merges the mesh once the network heals.
func TestPartitionLongHeal(t *testing.T) {
	for _, reconnect := range []bool{true, false} {
		t.Run(fmt.Sprintf("reconnect=%v", reconnect), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCluster(t, 5, 7, func(cfg *Config) {
					if !reconnect {
						cfg.ReconnectInterval = -1
					}
				})
				defer c.close()
				all := c.names()
				waitFor(t, 60*time.Second, "converge", func() bool { return c.converged(all) })
				major, minor := all[:3], all[3:]
				n1, n4 := c.nodes["n1"], c.nodes["n4"]
				if n4.ExpectedSize() != 5 {
					t.Fatalf("expected size %d", n4.ExpectedSize())
				}

				c.net.Partition(major, minor)
				cut := time.Now()
				err := n4.RequireQuorum(context.Background(), 3)
				if err == nil || err.Error() != "partition_no_quorum: alive 2, required 3" || time.Since(cut) > n4.cfg.RequestTimeout {
					t.Errorf("minority quorum = %v after %v", err, time.Since(cut))
				}
				if got := n4.PartitionState(); got != Healthy {
					t.Errorf("minority partition state %s right after the failed quorum: want healthy until the change has held for %v", got, DefaultPartitionHold)
				}
				held := waitFor(t, 2*DefaultPartitionHold, "minority reports partitioned", func() bool { return n4.PartitionState() == Partitioned })
				if held < DefaultPartitionHold-time.Second {
					t.Errorf("minority reported partitioned after %v, before the %v hold", held, DefaultPartitionHold)
				}
				start := time.Now()
				if err := n1.RequireQuorum(context.Background(), 3); err != nil || time.Since(start) > n1.cfg.RequestTimeout {
					t.Errorf("majority quorum = %v after %v", err, time.Since(start))
				}
				if out, err := n1.Request(context.Background(), "n3", "echo", []byte("x")); err != nil || string(out) != "n3:x" {
					t.Errorf("majority request = %q %v", out, err)
				}

				// Both sides declare the other dead.
				majTook := waitFor(t, 120*time.Second, "majority sees the minority dead", func() bool {
					return state(n1, "n4") == StateDead && state(n1, "n5") == StateDead
				})
				minTook := waitFor(t, 120*time.Second, "minority sees the majority dead", func() bool {
					for _, s := range major {
						if state(n4, s) != StateDead {
							return false
						}
					}
					return true
				}) + majTook
				if got := n4.PartitionState(); got != Partitioned {
					t.Errorf("minority %s", got)
				}
				if got := n1.PartitionState(); got != SuspectedPartition {
					t.Errorf("majority %s", got)
				}
				report(t, "3|2 partition: majority declares minority dead after %v, minority declares majority dead after %v simulated", majTook, minTook)

				// Stay partitioned well past GossipToTheDeadTime (30 s).
				time.Sleep(2*time.Minute - time.Since(cut))
				c.net.Heal()
				healed := time.Now()
				if reconnect {
					took := waitFor(t, 60*time.Second, "re-merge after heal", func() bool { return c.converged(all) })
					report(t, "long partition (2m) healed: reconnect loop re-merged all 5 nodes in %v simulated (ReconnectInterval %v)", took, n1.cfg.ReconnectInterval)
					if q := n4.Quorum(context.Background(), 0); q != 5 {
						t.Errorf("quorum after re-merge = %d", q)
					}
					waitFor(t, 2*DefaultPartitionHold, "healthy after re-merge", func() bool { return n4.PartitionState() == Healthy })
				} else {
					time.Sleep(60 * time.Second)
					merged := c.converged(all)
					report(t, "long partition (2m) healed WITHOUT the reconnect loop: merged after %v: %v (memberlist gives up)", time.Since(healed), merged)
					if merged {
						t.Error("memberlist re-merged by itself; the reconnect loop would be unnecessary")
					}
				}
			})
		})
	}
}

// A second node with an id already in the mesh is refused, loudly.
func TestDuplicateNodeRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 3, 3, nil)
		defer c.close()
		all := c.names()
		waitFor(t, 30*time.Second, "converge", func() bool { return c.converged(all) })
		origAddr := c.nodes["n2"].SelfAddr()

		dup, err := c.start("n2", nil)
		if err == nil {
			_ = dup.Shutdown()
			t.Fatal("duplicate n2 was accepted")
		}
		if !errors.Is(err, ErrDuplicateNode) || !strings.Contains(err.Error(), origAddr) {
			t.Errorf("err = %v", err)
		}
		time.Sleep(30 * time.Second)
		for _, s := range all {
			for _, mem := range c.nodes[s].Members() {
				if mem.Name == "n2" && (mem.Addr != origAddr || mem.State != StateAlive) {
					t.Errorf("%s sees n2 as %+v, want alive at %s", s, mem, origAddr)
				}
			}
			if !sees(c.nodes[s], all) {
				t.Errorf("%s members %+v", s, c.nodes[s].Members())
			}
		}
		logs := c.logs.String()
		if !strings.Contains(logs, "DUPLICATE NODE ID") {
			t.Errorf("no loud log:\n%s", logs)
		}
		report(t, "duplicate id: New error %q", err)
	})
}

// A node with another key, or another label, cannot join.
func TestWrongKeyOrLabelCannotJoin(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"key", func(cfg *Config) { cfg.SecretKey = []byte("0123456789abcdef0123456789abcdef") }},
		{"label", func(cfg *Config) { cfg.Label = "other-site" }},
		{"no_key", func(cfg *Config) { cfg.SecretKey = nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCluster(t, 2, 4, nil)
				defer c.close()
				waitFor(t, 30*time.Second, "converge", func() bool { return c.converged([]string{"n1", "n2"}) })
				bad, err := c.start("n3", tc.mod)
				if err != nil {
					t.Fatalf("a failed join must not be fatal: %v", err)
				}
				defer bad.Shutdown()
				time.Sleep(45 * time.Second) // several reconnect rounds
				for _, s := range []string{"n1", "n2"} {
					if st := state(c.nodes[s], "n3"); st != "" {
						t.Errorf("%s knows n3 as %s", s, st)
					}
				}
				if got := len(bad.Members()); got != 1 {
					t.Errorf("intruder sees %d members", got)
				}
				st := bad.Status()
				if st.LastJoinError == "" {
					t.Error("no join error reported")
				}
				report(t, "wrong %s: join error %q", tc.name, st.LastJoinError)
			})
		})
	}
}

// 10 % packet loss: the mesh still converges, nobody is falsely declared
// dead, and requests succeed.
func TestMessageLossConverges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := meshtest.NewNetwork(10)
		nw.Drop(0.10)
		c := newClusterOn(t, nw, 5, nil)
		defer c.close()
		all := c.names()
		took := waitFor(t, 120*time.Second, "converge under 10% loss", func() bool { return c.converged(all) })
		report(t, "5 nodes under 10%% packet loss converged in %v simulated", took)
		deaths := 0
		for range 120 {
			time.Sleep(500 * time.Millisecond)
			for _, s := range all {
				for _, mem := range c.nodes[s].Members() {
					if mem.State == StateDead {
						deaths++
					}
				}
			}
		}
		if deaths > 0 {
			t.Errorf("%d dead observations under 10%% loss", deaths)
		}
		replies, errs, _ := c.nodes["n1"].Fanout(context.Background(), all, "echo", []byte("x"))
		if len(replies) != 5 {
			t.Errorf("fanout under loss: %d replies, errs %v", len(replies), errs)
		}
		var dropped, sent int64
		for _, s := range c.net.Stats() {
			dropped += s.PacketsDropped
			sent += s.PacketsSent
		}
		report(t, "loss: %d of %d packets dropped (%.1f%%), %d false deaths in 60 s", dropped, sent, 100*float64(dropped)/float64(sent), deaths)
		// The failure detector still works under loss, without collateral deaths.
		c.net.Crash("n5")
		took = waitFor(t, 60*time.Second, "n5 dead under loss", func() bool {
			for _, s := range all[:4] {
				if state(c.nodes[s], "n5") != StateDead {
					return false
				}
			}
			return true
		})
		for _, s := range all[:4] {
			if !sees(c.nodes[s], all[:4]) {
				t.Errorf("%s: %+v", s, c.nodes[s].Members())
			}
		}
		report(t, "crash under 10%% loss: n5 dead on all 4 survivors after %v simulated", took)
	})
}

// Gossip bandwidth at rest, counted by meshtest.
func TestGossipBytesAtRest(t *testing.T) {
	for _, n := range []int{3, 5, 10} {
		t.Run(fmt.Sprintf("%d", n), func(t *testing.T) {
			if n > 5 && testing.Short() {
				t.Skip("short")
			}
			synctest.Test(t, func(t *testing.T) {
				c := newCluster(t, n, uint64(20+n), nil)
				defer c.close()
				all := c.names()
				waitFor(t, 60*time.Second, "converge", func() bool { return c.converged(all) })
				time.Sleep(30 * time.Second)
				c.net.ResetStats()
				const window = 120 * time.Second
				time.Sleep(window)
				var total, pkt, stream int64
				for _, s := range c.net.Stats() {
					total += s.BytesSent()
					pkt += s.PacketBytesSent
					stream += s.StreamBytesSent
				}
				per := float64(total) / float64(n) / window.Seconds()
				report(t, "gossip at rest, %d nodes, LAN profile, encrypted: %.0f bytes/node/s sent (packets %.0f, push/pull streams %.0f)",
					n, per, float64(pkt)/float64(n)/window.Seconds(), float64(stream)/float64(n)/window.Seconds())
				if per > 5000 {
					t.Errorf("%.0f B/node/s at rest", per)
				}
			})
		})
	}
}
