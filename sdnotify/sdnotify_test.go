package sdnotify

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// recorder stands in for the service manager's socket in the synctest
// bubble (a real socket's reads are not durably blocking).
type recorder struct {
	mu   sync.Mutex
	sent []string
}

func (r *recorder) send(s string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, s)
	return true, nil
}

func (r *recorder) pings() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.sent {
		if s == "WATCHDOG=1" {
			n++
		}
	}
	return n
}

// TestWatchFeedsOnlyWhileAlive: pings every third of the watchdog time
// while alive; none while not (the STATUS says why, once); again once
// alive; none after ctx ends.
func TestWatchFeedsOnlyWhileAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		n := &Notifier{send: rec.send, interval: 9 * time.Second, log: slog.New(slog.DiscardHandler)}
		var mu sync.Mutex
		var stuck error
		alive := func() error { mu.Lock(); defer mu.Unlock(); return stuck }
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); n.Watch(ctx, alive) }()

		time.Sleep(9*time.Second + time.Millisecond) // pings at 0, 3, 6, 9 s
		synctest.Wait()
		if got := rec.pings(); got != 4 {
			t.Fatalf("alive for 9 s: %d pings, want 4", got)
		}
		mu.Lock()
		stuck = errors.New("the device step of do_valve has run for 1m")
		mu.Unlock()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if got := rec.pings(); got != 4 {
			t.Fatalf("not alive: %d pings, want still 4", got)
		}
		rec.mu.Lock()
		statuses := 0
		for _, s := range rec.sent {
			if strings.HasPrefix(s, "STATUS=watchdog withheld: the device step of do_valve") {
				statuses++
			}
		}
		rec.mu.Unlock()
		if statuses != 1 {
			t.Fatalf("%d withheld statuses, want 1: %q", statuses, rec.sent)
		}
		mu.Lock()
		stuck = nil
		mu.Unlock()
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if got := rec.pings(); got != 5 {
			t.Fatalf("alive again: %d pings, want 5", got)
		}
		cancel()
		<-done
		time.Sleep(time.Minute)
		if got := rec.pings(); got != 5 {
			t.Fatalf("after ctx ended: %d pings, want 5", got)
		}
	})
}

// TestNotifySocket: through a real datagram socket, as systemd listens:
// READY=1, STOPPING=1 and WATCHDOG=1 arrive; WATCHDOG_USEC sets the
// interval; a WATCHDOG_PID of another process means no watchdog here; a
// malformed WATCHDOG_USEC is an error that says the fix.
func TestNotifySocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "300000")
	t.Setenv("WATCHDOG_PID", "")
	os.Unsetenv("WATCHDOG_PID")
	n, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if n.WatchdogInterval() != 300*time.Millisecond {
		t.Fatalf("interval %v, want 300ms", n.WatchdogInterval())
	}
	read := func() string {
		t.Helper()
		buf := make([]byte, 4096)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, err := conn.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:k])
	}
	n.Ready()
	if got := read(); !strings.HasPrefix(got, "READY=1") {
		t.Fatalf("got %q, want READY=1", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go n.Watch(ctx, func() error { return nil })
	if got := read(); got != "WATCHDOG=1" {
		t.Fatalf("got %q, want WATCHDOG=1", got)
	}
	cancel()
	n.Stopping()
	for {
		if got := read(); strings.HasPrefix(got, "STOPPING=1") {
			break
		} else if got != "WATCHDOG=1" {
			t.Fatalf("got %q, want STOPPING=1", got)
		}
	}

	t.Setenv("WATCHDOG_PID", "1")
	if n, err := New(nil); err != nil || n.WatchdogInterval() != 0 {
		t.Fatalf("another process's watchdog: interval %v, err %v; want none", n.WatchdogInterval(), err)
	}
	os.Unsetenv("WATCHDOG_PID")
	t.Setenv("WATCHDOG_USEC", "ten seconds")
	if _, err := New(nil); err == nil || !strings.Contains(err.Error(), "WatchdogSec=") {
		t.Fatalf("malformed WATCHDOG_USEC: err %v, want one naming WatchdogSec=", err)
	}
}
