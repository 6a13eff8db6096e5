package node

import (
	"fmt"
	"time"
)

// Liveness answers the service manager's watchdog (systemd WatchdogSec):
// physd may say it is alive only while its actuation path and its
// observation loop make progress. A device step that outlives every bound
// its own timeouts give it, or a background poll that stopped coming
// round, means a goroutine is stuck where no deadline reaches (a driver
// that ignores its context, a wedged storage write); then the watchdog is
// not fed, and the service manager kills and restarts physd, whose start
// recovers the ledger. A slow device is not a hang: every bound here is
// derived from the capability's own timeout, poll interval and settle time.

// stepSlack covers what a device step does besides device accesses: the
// ledger commit before it and the fsynced audit line after it, which take
// seconds at worst on a slow SD card.
const stepSlack = 30 * time.Second

// pollSlack covers a shared read's and a poll round's scheduling beyond
// their timeout and interval.
const pollSlack = 10 * time.Second

func (n *Node) monoNow() int64 { return int64(time.Since(n.born)) + 1 } // never 0: 0 means "no mark"

func (n *Node) markStep(cs *capState)   { cs.stepSince.Store(n.monoNow()) }
func (n *Node) markPolled(cs *capState) { cs.polledAt.Store(n.monoNow()) }

// stepBound is the longest a device step of cs can take when every device
// access honours its deadline: the previous read, the write and the
// read-back (each within the capability's timeout), the settle time, and
// stepSlack.
func stepBound(cs *capState) time.Duration {
	return 3*cs.cap.Timeout() + time.Duration(cs.cap.SettleMS)*time.Millisecond + stepSlack
}

// readBound is the longest a shared device read of cs can take.
func readBound(cs *capState) time.Duration { return cs.cap.Timeout() + pollSlack }

// pollBound is the longest between two finished poll rounds of cs.
func pollBound(cs *capState) time.Duration {
	return 2*cs.cap.PollInterval() + cs.cap.Timeout() + pollSlack
}

// Alive reports nil while every device step under way is within its bound
// every shared device read (what read_, can_do and the background polls
// wait on) is within its bound, and every background poll of the
// manifest in force came round within its bound; otherwise an error that names the capability and how long it
// has been stuck.
func (n *Node) Alive() error {
	now := n.monoNow()
	for _, cs := range n.bound().caps {
		if since := cs.stepSince.Load(); since != 0 {
			if d := time.Duration(now - since); d > stepBound(cs) {
				return fmt.Errorf("the device step of %s has run for %s, beyond its bound %s (3 × timeout + settle + %s): the actuation path is stuck",
					cs.tool, d.Round(time.Millisecond), stepBound(cs), stepSlack)
			}
		}
		if since := cs.readSince.Load(); since != 0 {
			if d := time.Duration(now - since); d > readBound(cs) {
				return fmt.Errorf("the shared device read of %s has run for %s, beyond its bound %s (timeout + %s): the observation loop is stuck",
					cs.tool, d.Round(time.Millisecond), readBound(cs), pollSlack)
			}
		}
		if cs.cap.PollInterval() <= 0 || cs.point == nil {
			continue
		}
		if at := cs.polledAt.Load(); at != 0 {
			if d := time.Duration(now - at); d > pollBound(cs) {
				return fmt.Errorf("the background poll of %s last came round %s ago, beyond its bound %s (2 × poll + timeout + %s): the observation loop is stuck",
					cs.tool, d.Round(time.Millisecond), pollBound(cs), pollSlack)
			}
		}
	}
	return nil
}
