package e2e

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// notifySupervisor is a service manager as far as physd can tell: it owns
// the $NOTIFY_SOCKET datagram socket (sd_notify(3)), sets $WATCHDOG_USEC,
// and — like systemd with WatchdogSec= and Restart=on-watchdog — kills a
// physd that has not said WATCHDOG=1 within the watchdog time.
type notifySupervisor struct {
	t        *testing.T
	sock     *net.UnixConn
	path     string
	watchdog time.Duration
	msgs     chan notifyMsg
	lastPing time.Time // the last WATCHDOG=1 that fires saw
}

// notifyMsg is one state line and when the socket reader took it off the
// socket (the nearest the test gets to when physd sent it).
type notifyMsg struct {
	state string
	at    time.Time
}

func newNotifySupervisor(t *testing.T, watchdog time.Duration) *notifySupervisor {
	t.Helper()
	// A short path: sun_path holds 108 bytes, t.TempDir() may not fit.
	dir, err := os.MkdirTemp("", "sdn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s := &notifySupervisor{t: t, sock: conn, path: path, watchdog: watchdog, msgs: make(chan notifyMsg, 1024)}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(s.msgs)
				return
			}
			at := time.Now()
			for _, line := range strings.Split(string(buf[:n]), "\n") {
				s.msgs <- notifyMsg{line, at}
			}
		}
	}()
	return s
}

// start runs physd on the greenhouse example under the supervisor.
func (s *notifySupervisor) start(state string) (*exec.Cmd, *syncBuffer) {
	s.t.Helper()
	cmd := exec.Command(physdBin, "run", "--manifest", greenhouse, "--state", state, "--http", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+s.path, "WATCHDOG_USEC="+strconv.FormatInt(s.watchdog.Microseconds(), 10))
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	return cmd, stderr
}

// await waits for a state (READY=1, WATCHDOG=1, STOPPING=1) within d and
// returns when it came.
func (s *notifySupervisor) await(state string, d time.Duration) time.Time {
	s.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case m, ok := <-s.msgs:
			if !ok {
				s.t.Fatalf("notify socket closed while waiting for %s", state)
			}
			if m.state == state {
				return m.at
			}
		case <-deadline:
			s.t.Fatalf("no %s within %v", state, d)
		}
	}
}

// fires drains the pings physd sends and returns when the watchdog would
// fire: the first moment more than the watchdog time has passed since the
// last WATCHDOG=1 (from, or a ping that arrives after it); false if it
// does not fire within limit. A ping taken off the socket after sentBy (the
// moment the process was stopped; zero: running) was sent before it: its
// time is sentBy, so the reader's own scheduling delay is not counted as
// physd's.
func (s *notifySupervisor) fires(from time.Time, limit time.Duration, sentBy time.Time) (time.Time, bool) {
	deadline := time.After(limit)
	for {
		// The watchdog fires at the last ping + the watchdog time; the
		// moment this goroutine wakes after that adds the test's own timer
		// latency, which is not physd's, so the expiry itself is returned.
		expiry := from.Add(s.watchdog)
		wait := time.Until(expiry)
		if wait < 0 {
			return expiry, true
		}
		select {
		case m := <-s.msgs:
			if m.state == "WATCHDOG=1" {
				at := m.at
				if !sentBy.IsZero() && at.After(sentBy) {
					at = sentBy
				}
				from, s.lastPing = at, at
			}
		case <-time.After(wait):
			return expiry, true
		case <-deadline:
			return time.Time{}, false
		}
	}
}

// TestWatchdogSupervisor: under a service manager that speaks the notify
// protocol, physd says READY=1 only once it answers HTTP, feeds the
// watchdog while it runs (none of the pings missed for many watchdog
// times), stops feeding it when frozen (SIGSTOP: a hung process), is
// killed by the supervisor within the watchdog time, and the restart on
// the same state directory reports the unclean stop and is READY again;
// SIGTERM says STOPPING=1, and the next start after that clean stop
// reports none.
func TestWatchdogSupervisor(t *testing.T) {
	const watchdog = 1500 * time.Millisecond
	s := newNotifySupervisor(t, watchdog)
	state := t.TempDir()
	rounds := 2
	if v, err := strconv.Atoi(os.Getenv("PHYSD_CHAOS_ROUNDS")); err == nil && v > 0 {
		rounds = v // bench/chaos.sh: 20 rounds, p50/p99 of the figures below
	}
	var toKill, toReady []time.Duration
	cmd, stderr := s.start(state)
	s.await("READY=1", 30*time.Second)
	addr := stderr.logValue(t, "listening", "addr")
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("at READY=1, /healthz: %v %v", resp, err)
	}
	resp.Body.Close()
	for round := range rounds {
		// Alive: no gap longer than the watchdog time over 3 of them.
		if at, fired := s.fires(time.Now(), 3*watchdog, time.Time{}); fired {
			t.Fatalf("round %d: a running physd missed the watchdog at %v; stderr:\n%s", round, at, stderr.String())
		}
		frozen := time.Now()
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		at, fired := s.fires(s.lastPing, 10*watchdog, frozen) // pings still queued move it on
		if !fired {
			t.Fatalf("round %d: a frozen physd kept feeding the watchdog", round)
		}
		// The supervisor's kill: SIGKILL reaches a stopped process (systemd
		// sends SIGABRT, then SIGKILL after TimeoutAbortSec).
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		toKill = append(toKill, at.Sub(frozen))
		// The last ping came at most a ping interval (a third of the
		// watchdog time) before the freeze.
		if d := at.Sub(frozen); d > watchdog || d < watchdog-watchdog/3-50*time.Millisecond {
			t.Errorf("round %d: the watchdog fired %v after the freeze; want within (%v, %v]", round, d, watchdog-watchdog/3, watchdog)
		}
		restart := time.Now()
		cmd, stderr = s.start(state)
		ready := s.await("READY=1", 30*time.Second)
		toReady = append(toReady, ready.Sub(restart))
		if pid := stderr.logValue(t, "the previous run did not stop cleanly", "previous_pid"); pid == "" {
			t.Fatalf("round %d: the restart did not report the unclean stop", round)
		}
		addr = stderr.logValue(t, "listening", "addr")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s.await("STOPPING=1", 15*time.Second)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM: %v; stderr:\n%s", err, stderr.String())
	}
	cmd, stderr = s.start(state)
	s.await("READY=1", 30*time.Second)
	stderr.logValue(t, "ready", "ready")
	if strings.Contains(stderr.String(), "did not stop cleanly") {
		t.Fatalf("after a clean stop the start reports an unclean one:\n%s", stderr.String())
	}
	t.Logf("watchdog %v, %d rounds: freeze→kill %s; restart→READY %s", watchdog, rounds, quantiles(toKill), quantiles(toReady))
}

// quantiles formats p50/p99/max of ds.
func quantiles(ds []time.Duration) string {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return "p50 " + percentile(s, 0.5, time.Millisecond).String() + " p99 " + percentile(s, 0.99, time.Millisecond).String() +
		" max " + s[len(s)-1].Round(time.Millisecond).String()
}

// percentile is the q-quantile of sorted, rounded to round.
func percentile(sorted []time.Duration, q float64, round time.Duration) time.Duration {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))].Round(round)
}
