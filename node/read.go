package node

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// capState is one capability's binding and last observation.
type capState struct {
	cap     *manifest.Capability
	tool    string
	point   drivers.Point
	bus     drivers.Bus
	bindErr error           // why the capability has no point (bus missing)
	vocab   map[string]bool // stemmed words can_do matches against, built once

	last      atomic.Pointer[sample] // last successful device read
	lastErr   atomic.Pointer[error]  // last device error, nil after a success
	refreshMu sync.Mutex             // one device read at a time per capability
	latencyUS atomic.Int64           // EWMA of device latency, microseconds
}

type sample struct {
	value any
	at    time.Time
}

// staleLimit is how long a failing capability keeps serving its last value
// as stale before it reads error: ten cache lifetimes, at least 30 s.
func staleLimit(c *manifest.Capability) time.Duration {
	return max(10*c.CacheTTL(), 30*time.Second)
}

// Read returns an observation of a read_ (or do_) capability. maxAge, when
// ≥ 0, bounds the age of a cached value the caller accepts (0 forces a
// device read). The only error is an unknown capability.
func (n *Node) Read(ctx context.Context, tool string, maxAge time.Duration) (promcp.Observation, error) {
	cs, err := n.capability(tool)
	if err != nil {
		return promcp.Observation{}, err
	}
	return n.observe(ctx, cs, maxAge), nil
}

func (n *Node) observe(ctx context.Context, cs *capState, maxAge time.Duration) promcp.Observation {
	ttl := cs.cap.CacheTTL()
	if maxAge >= 0 && maxAge < ttl {
		ttl = maxAge
	}
	if s := cs.last.Load(); s != nil && ttl > 0 && time.Since(s.at) <= ttl {
		return n.observation(cs, s, true, nil)
	}
	cs.refreshMu.Lock()
	defer cs.refreshMu.Unlock()
	// Another caller may have refreshed while we waited.
	if s := cs.last.Load(); s != nil && ttl > 0 && time.Since(s.at) <= ttl {
		return n.observation(cs, s, true, nil)
	}
	s, err := n.readDevice(ctx, cs)
	if err != nil {
		return n.observation(cs, cs.last.Load(), false, err)
	}
	return n.observation(cs, s, false, nil)
}

// readDevice reads the point within the capability's timeout and records
// the result in the cache.
func (n *Node) readDevice(ctx context.Context, cs *capState) (*sample, error) {
	if cs.point == nil {
		return nil, cs.bindErr
	}
	ctx, cancel := context.WithTimeout(ctx, cs.cap.Timeout())
	defer cancel()
	start := time.Now()
	r, err := cs.point.Read(ctx)
	cs.noteLatency(time.Since(start))
	if err == nil {
		err = checkValueType(cs.cap, r.Value)
	}
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, drivers.ErrTimeout) {
			err = errors.Join(drivers.ErrTimeout, err)
		}
		cs.lastErr.Store(&err)
		if n.onDeviceErr != nil {
			n.onDeviceErr(cs.cap.Binding.Bus, err)
		}
		return nil, err
	}
	if r.At.IsZero() {
		r.At = time.Now()
	}
	s := &sample{value: quantise(cs.cap, r.Value), at: r.At}
	cs.last.Store(s)
	cs.lastErr.Store(nil)
	return s, nil
}

// markedDown reports whether the driver has marked this capability's
// device (or its whole bus) down.
func (cs *capState) markedDown() bool {
	if ph, ok := cs.point.(drivers.PointHealth); ok && ph.Health() != nil {
		return true
	}
	return cs.bus != nil && cs.bus.Health() != nil
}

func (cs *capState) noteLatency(d time.Duration) {
	us := d.Microseconds()
	old := cs.latencyUS.Load()
	if old == 0 {
		cs.latencyUS.Store(us)
		return
	}
	cs.latencyUS.Store((old*7 + us) / 8)
}

// observation builds the proMCP read response. With readErr set, s is the
// last good sample (or nil): stale while it is recent, error after that.
func (n *Node) observation(cs *capState, s *sample, cached bool, readErr error) promcp.Observation {
	now := time.Now()
	o := promcp.Observation{
		Unit:       cs.cap.Unit,
		Capability: cs.tool,
		Source:     n.DeviceID(),
		Cached:     cached,
	}
	switch {
	case readErr == nil:
		o.Value, o.Timestamp = s.value, s.at
		o.Quality = promcp.QualityGood
		if !inRange(cs.cap, s.value) {
			o.Quality = promcp.QualityDegraded
			o.Reason = "value outside the capability's physical range " + rangeText(cs.cap) + ": check the sensor before acting"
		}
	case s != nil && now.Sub(s.at) <= staleLimit(cs.cap):
		o.Value, o.Timestamp = s.value, s.at
		o.Quality = promcp.QualityStale
		o.Reason = "device read failed, serving the last good value: " + readErr.Error()
		if cs.markedDown() {
			o.Quality = promcp.QualityDegraded
			o.Reason = "device is marked down, serving the last good value: " + readErr.Error()
		}
	default:
		o.Timestamp = now
		o.Quality = promcp.QualityError
		o.Reason = "no usable value: " + readErr.Error()
	}
	o.AgeMS = max(now.Sub(o.Timestamp).Milliseconds(), 0)
	o.Timestamp = o.Timestamp.UTC()
	return o
}

func inRange(c *manifest.Capability, v any) bool {
	f, ok := asFloat(v)
	if !ok || c.Range == nil {
		return true
	}
	return c.Range.Contains(f)
}

func rangeText(c *manifest.Capability) string {
	if c.Range == nil {
		return ""
	}
	return "[" + promcp.FormatValue(c.Range.Min) + ", " + promcp.FormatValue(c.Range.Max) + "]"
}

func asFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, !math.IsNaN(x) && !math.IsInf(x, 0)
	case int64:
		return float64(x), true
	}
	return 0, false
}

// checkValueType rejects a driver value that does not match the data type,
// so a driver bug can never reach an agent as a good observation.
func checkValueType(c *manifest.Capability, v any) error {
	ok := false
	switch c.DataType {
	case manifest.TypeFloat:
		f, isF := v.(float64)
		ok = isF && !math.IsNaN(f) && !math.IsInf(f, 0)
	case manifest.TypeInt:
		_, ok = v.(int64)
	case manifest.TypeBool:
		_, ok = v.(bool)
	case manifest.TypeString, manifest.TypeEnum:
		_, ok = v.(string)
	}
	if !ok {
		return errors.New("driver returned a value that does not match data_type " + c.DataType)
	}
	return nil
}

// quantise rounds a float reading to the capability's precision: the
// manifest states the sensor's resolution, and digits beyond it are noise
// an agent should not reason about.
func quantise(c *manifest.Capability, v any) any {
	f, ok := v.(float64)
	if !ok || c.Precision <= 0 {
		return v
	}
	q := math.Round(f/c.Precision) * c.Precision
	// Trim binary representation noise (0.1*175 = 17.500000000000004).
	digits := max(0, int(math.Ceil(-math.Log10(c.Precision))))
	p := math.Pow10(digits)
	return math.Round(q*p) / p
}
