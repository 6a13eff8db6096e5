package mesh

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/mesh/meshtest"
)

// A silent owner (stopped like SIGSTOP: it accepts connections and never
// reads them; or behind a cut link: dials go nowhere) fails a Call with
// ErrNoAck naming it at RequestTimeout, whatever the caller's own deadline;
// a plain Request ends at its deadline; neither waits for memberlist's 10 s
// TCP timeout.
func TestSilentOwnerBoundedByDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 4, 21, nil)
		defer c.close()
		all := c.names()
		waitFor(t, 60*time.Second, "converge", func() bool { return c.converged(all) })
		n1 := c.nodes["n1"]
		rt := n1.cfg.RequestTimeout

		c.net.Stop("n3")                  // frozen process: accepts, never reads
		c.net.Partition(all[:1], all[3:]) // n1 | n4: a cut link
		for _, victim := range []string{"n3", "n4"} {
			for _, commit := range []bool{false, true} {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				_, err := n1.Call(ctx, victim, "count", nil, CallOptions{Commit: commit})
				took := time.Since(start)
				cancel()
				if !errors.Is(err, ErrNoAck) || !strings.Contains(err.Error(), victim) || took > rt {
					t.Errorf("Call(%s, commit=%v) = %v after %v; want ErrNoAck naming it within %v", victim, commit, err, took, rt)
				}
				report(t, "Call to silent %s (commit=%v): %v after %v (request_timeout %v)", victim, commit, err, took, rt)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			start := time.Now()
			_, err := n1.Request(ctx, victim, "echo", nil)
			took := time.Since(start)
			cancel()
			if !errors.Is(err, ErrTimeout) || took > 2*time.Second {
				t.Errorf("Request(%s) = %v after %v; want ErrTimeout at its 2 s deadline", victim, err, took)
			}
		}
		// The frozen owner resumes: the requests that waited in its
		// buffers are never served (the two-phase one had no go-ahead;
		// the others' writers gave up at their deadline).
		c.net.Resume("n3")
		time.Sleep(5 * time.Second)
		if got := served.Get("n3"); got != 0 {
			t.Errorf("n3 served %d stale requests after resuming", got)
		}
		// The go-ahead left and the owner is still at it when the
		// caller's deadline comes: the outcome is unknown (not "failed").
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := n1.Call(ctx, "n3", "slow", nil, CallOptions{Commit: true}) // n3's "slow" takes 2 s
		cancel()
		if !errors.Is(err, ErrOutcomeUnknown) {
			t.Errorf("Call(n3 slow, commit) with a 1 s deadline = %v, want ErrOutcomeUnknown", err)
		}
		// A live owner serves a two-phase Call exactly once.
		before := served.Get("n2")
		if out, err := n1.Call(context.Background(), "n2", "count", nil, CallOptions{Commit: true}); err != nil || string(out) != "n2" {
			t.Fatalf("Call(n2) = %q %v", out, err)
		}
		if got := served.Get("n2") - before; got != 1 {
			t.Errorf("n2 served a two-phase call %d times", got)
		}
	})
}

// A quorum round decides DecisionMargin before its deadline, so the
// refusal reaches the client within request_timeout_ms.
func TestQuorumDecidedBeforeDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 5, 22, nil)
		defer c.close()
		all := c.names()
		waitFor(t, 60*time.Second, "converge", func() bool { return c.converged(all) })
		n1 := c.nodes["n1"]
		c.net.Stop("n4", "n5")
		c.net.Crash("n3")
		start := time.Now()
		err := n1.RequireQuorum(context.Background(), 4)
		took := time.Since(start)
		var qe *QuorumError
		if !errors.As(err, &qe) || qe.Alive != 2 || took > n1.cfg.RequestTimeout-n1.DecisionMargin() {
			t.Errorf("RequireQuorum = %v after %v; want alive 2, decided by %v", err, took, n1.cfg.RequestTimeout-n1.DecisionMargin())
		}
		// A caller with a shorter deadline gets its answer before it too.
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start = time.Now()
		_ = n1.RequireQuorum(ctx, 4)
		if took := time.Since(start); took >= 200*time.Millisecond {
			t.Errorf("quorum with a 200 ms caller deadline decided after %v", took)
		}
		report(t, "quorum refusal (2 of 4) decided after %v (request_timeout %v, margin %v)", took, n1.cfg.RequestTimeout, n1.DecisionMargin())
	})
}

// Under 20 % loss of packets, of connection attempts (a lost SYN costs TCP
// 1 s, twice the whole budget) and of stream segments (200 ms each),
// routed reads are still acknowledged within 500 ms (≥ 97 %) because a new
// attempt starts every RetryInterval; and partition_state does not flap
// over 5 minutes (it does without the hysteresis).
func TestLossyLinkRetriesAndNoFlap(t *testing.T) {
	for _, hold := range []time.Duration{DefaultPartitionHold, -1} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				nw := meshtest.NewNetwork(23)
				c := newClusterOn(t, nw, 5, func(cfg *Config) { cfg.PartitionHold = hold })
				defer c.close()
				all := c.names()
				waitFor(t, 60*time.Second, "converge", func() bool { return c.converged(all) })
				time.Sleep(5 * time.Second)
				nw.Drop(0.20)
				nw.SynLoss(0.20)
				changes, deaths, ok, failed, qok, qfailed := 0, 0, 0, 0, 0, 0
				last := map[string]string{}
				for _, s := range all {
					last[s] = c.nodes[s].PartitionState()
				}
				var firstErr error
				end := time.Now().Add(5 * time.Minute)
				for i := 0; time.Now().Before(end); i++ {
					time.Sleep(100 * time.Millisecond)
					for _, s := range all {
						m := c.nodes[s]
						if st := m.PartitionState(); st != last[s] {
							if testing.Verbose() {
								var states []string
								for _, mem := range m.Members() {
									states = append(states, mem.Name+"="+mem.State)
								}
								t.Logf("%v %s: %s -> %s %v", time.Since(end.Add(-5*time.Minute)), s, last[s], st, states)
							}
							changes++
							last[s] = st
						}
						for _, mem := range m.Members() {
							if mem.State == StateDead {
								deaths++
							}
						}
					}
					if i%10 == 5 { // a quorum of all 5 every second
						if q := c.nodes["n5"].Quorum(context.Background(), 5); q == 5 {
							qok++
						} else {
							qfailed++
						}
					}
					if i%10 == 0 { // a routed read every second
						to := all[1+i/10%4]
						// As a routed read: acknowledged within request_timeout, answered within 5 s.
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						out, err := c.nodes["n1"].Call(ctx, to, "echo", []byte("r"), CallOptions{})
						cancel()
						if err == nil && string(out) == to+":r" {
							ok++
						} else {
							failed++
							if firstErr == nil {
								firstErr = err
							}
						}
					}
				}
				report(t, "hold %v, 20%% packet + SYN loss for 5 min: %d partition_state changes on 5 nodes, %d dead observations, reads %d ok / %d failed (first error %v), quorum of 5: %d ok / %d short",
					hold, changes, deaths, ok, failed, firstErr, qok, qfailed)
				if qfailed*100 > 3*(qok+qfailed) {
					t.Errorf("quorum of all 5 short %d times of %d under 20%% loss", qfailed, qok+qfailed)
				}
				if hold > 0 {
					if changes != 0 {
						t.Errorf("partition_state changed %d times under 20%% loss", changes)
					}
					if failed*100 > 3*(ok+failed) { // every stream write is lost (and retransmitted) 20 % of the time too
						t.Errorf("%d of %d reads failed under 20%% loss: %v", failed, ok+failed, firstErr)
					}
				}
			})
		})
	}
}
