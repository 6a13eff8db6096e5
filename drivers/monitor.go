package drivers

import (
	"errors"
	"time"

	"github.com/physd/physd/manifest"
)

// Monitorer is implemented by points whose device can push changes of the
// value (an OPC UA monitored item) instead of being read every poll_ms.
// The node monitors a capability with poll_ms through it and polls only
// the points that do not implement it, or whose monitor gave up.
//
// The contract, in both directions:
//
//   - Deadlines belong to the driver. Monitor returns at once; every wait
//     on the device behind it (connects, service calls, the keep-alives
//     that prove the device is still there) is bounded by the bus's own
//     timeouts, and the node never waits on a monitor.
//   - deliver is called from the driver's goroutine, one update at a time
//     and in order, never while the driver holds a lock the node could
//     need (Bus.Health, Point.Read). It records the update and returns: no
//     device access, no blocking.
//   - An update with a Reading is a value the device reported (its At is
//     the earliest moment the value is known to have held: for a sampled
//     item, its arrival less the sampling interval).
//   - An update with Err says the device no longer vouches for the last
//     Reading: the item failed, its value went Bad (Err carries the
//     status, as a Read's would), or the subscription or session was lost
//     (a server restart, a network cut, keep-alives past their deadline).
//     The node stops serving that reading as good at once. Only a later
//     Reading makes the value good again, and after a loss it is a value
//     the device reported after it.
//   - errors.Is(Err, ErrNotMonitored) says the driver gave up monitoring
//     this point for good (the device refused the deadband filter, or has
//     no room for another item): the node polls it instead, and says so.
//     No update follows it.
//   - Stop ends the monitor (the device forgets the item); it does not
//     wait for the device, and deliver may still run once while it
//     returns (the node ignores updates after Stop).
type Monitorer interface {
	Monitor(req MonitorRequest, deliver func(Update)) (Monitor, error)
}

// MonitorRequest is what the node asks a Monitorer to watch.
type MonitorRequest struct {
	// Interval is how often the device samples the value: the
	// capability's poll_ms.
	Interval time.Duration
	// Deadband, when set, is the change the device may keep to itself
	// (manifest deadband: absolute in the capability's unit, or a percent).
	Deadband *manifest.Deadband
}

// Update is one delivery of a Monitor: a Reading, or Err.
type Update struct {
	// Seq increases by one with each delivery of a monitor (from 1):
	// Monitor.Confirmed names the delivery it vouches for by it.
	Seq     uint64
	Reading Reading
	Err     error
}

// Monitor is one point's monitored value.
type Monitor interface {
	// Confirmed says which delivery the device still vouches for and as
	// of when: seq is that delivery's Seq (a Reading, or an Err that is
	// the value's own status, such as a Bad status code the item keeps
	// reporting), asOf the latest moment the device is known to have
	// held it — a publish response (data or keep-alive) of the live
	// subscription, less the sampling interval. The value may have
	// moved within the deadband since. seq 0 vouches for nothing: no
	// delivery yet, or the subscription is lost or silent past its
	// keep-alive deadline (checked on each call, so a driver whose own
	// goroutines stopped still stops vouching).
	Confirmed() (seq uint64, asOf time.Time)
	// Stop ends the monitor; it is idempotent.
	Stop()
}

// ErrNotMonitored marks the update of a monitor that gave up: the node
// polls the point instead.
var ErrNotMonitored = errors.New("the device does not monitor this point; polled instead")

// MonitorCounters is implemented by buses that monitor points (OPC UA
// subscriptions); /metrics exports them per bus.
type MonitorCounters interface {
	MonitorCounters() MonitorStats
}

// MonitorStats is a bus's monitoring so far.
type MonitorStats struct {
	Subscriptions int   // subscriptions the device holds for the bus now
	Items         int   // monitored items the device holds now
	Fallbacks     int   // monitors that gave up (polled instead) and are still in force
	Notifications int64 // value and status changes the device reported
	KeepAlives    int64 // keep-alives: the device had nothing to report
	Losses        int64 // subscriptions lost (server restart, network cut, keep-alive past its deadline)
}
