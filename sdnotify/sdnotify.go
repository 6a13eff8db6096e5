// Package sdnotify speaks the service manager's notify protocol
// (sd_notify(3), systemd Type=notify with WatchdogSec=): READY=1 once physd
// serves, WATCHDOG=1 only while the daemon's liveness check passes, and
// STOPPING=1 when shutdown begins. A hung physd stops feeding the watchdog
// and the service manager kills and restarts it; the restart then recovers
// the ledger and drives outputs to their safe states.
//
// The datagrams go through github.com/coreos/go-systemd/v22/daemon (the
// library systemd-managed Go daemons use). Without $NOTIFY_SOCKET every
// call is a no-op, so physd runs the same under a shell, a container or
// any other supervisor.
package sdnotify

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier sends notify-protocol states. The zero value is not usable;
// call New.
type Notifier struct {
	send func(state string) (bool, error)
	// interval is $WATCHDOG_USEC when the watchdog expects this process
	// ($WATCHDOG_PID unset or ours), else 0.
	interval time.Duration
	log      *slog.Logger
}

// New reads the environment the service manager set ($NOTIFY_SOCKET,
// $WATCHDOG_USEC, $WATCHDOG_PID). A malformed $WATCHDOG_USEC is an error:
// the unit asked for a watchdog that physd cannot honour.
func New(log *slog.Logger) (*Notifier, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return nil, fmt.Errorf("systemd watchdog: %w; fix: set WatchdogSec= in the unit to a duration (e.g. 10s), or unset WATCHDOG_USEC", err)
	}
	return &Notifier{send: func(s string) (bool, error) { return daemon.SdNotify(false, s) }, interval: interval, log: log}, nil
}

// WatchdogInterval is the service manager's watchdog time (0: none).
func (n *Notifier) WatchdogInterval() time.Duration { return n.interval }

// Ready says physd serves: the service manager starts dependent units and
// begins the watchdog.
func (n *Notifier) Ready() { n.notify(daemon.SdNotifyReady + "\nSTATUS=serving") }

// Stopping says shutdown began (outputs go safe, calls drain).
func (n *Notifier) Stopping() { n.notify(daemon.SdNotifyStopping + "\nSTATUS=stopping") }

// Status sets the one-line status systemctl status shows.
func (n *Notifier) Status(s string) { n.notify("STATUS=" + s) }

func (n *Notifier) notify(state string) {
	if _, err := n.send(state); err != nil {
		n.log.Warn("service manager notify failed", "state", state, "err", err.Error())
	}
}

// Watch feeds the watchdog until ctx ends: every third of the watchdog
// time (sd_watchdog_enabled(3) asks for less than half) it asks alive, and
// sends WATCHDOG=1 only when alive returns nil. When alive fails it sends
// nothing, so the service manager kills physd once the watchdog time has
// passed without a ping; the reason is logged and put in STATUS= first.
// Without a watchdog Watch returns at once.
func (n *Notifier) Watch(ctx context.Context, alive func() error) {
	if n.interval <= 0 {
		return
	}
	t := time.NewTicker(n.interval / 3)
	defer t.Stop()
	failing := false
	for {
		if err := alive(); err != nil {
			if !failing {
				n.log.Error("watchdog not fed: physd is not alive, the service manager will restart it", "err", err.Error())
				n.Status("watchdog withheld: " + err.Error())
			}
			failing = true
		} else {
			if failing {
				n.log.Info("watchdog fed again: physd is alive")
				n.Status("serving")
			}
			failing = false
			n.notify(daemon.SdNotifyWatchdog)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
