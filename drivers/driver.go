// Package drivers defines how physd talks to hardware: a Bus per named bus in
// the manifest (a simulated plant, an I2C bus, a Modbus endpoint), and a Point
// per capability binding on that bus. Drivers know nothing about policy,
// caching or MCP; the node owns those.
//
// Values cross this boundary normalised to one of four Go types: float64
// (data_type float), int64 (int), bool (bool) and string (string, enum).
package drivers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/physd/physd/manifest"
)

// Reading is one value observed at a point.
type Reading struct {
	Value any
	At    time.Time
	// Uncertain, when set, says why the device itself does not vouch for
	// Value (an OPC UA Uncertain status code): the node serves the value
	// with quality degraded and this reason.
	Uncertain string
}

// Point is one capability's binding, opened on its bus.
type Point interface {
	// Read observes the current value. It must honour ctx's deadline.
	Read(ctx context.Context) (Reading, error)
	// Write commands v (already checked against the capability's data type
	// and range by the node). It must honour ctx's deadline. Points of read
	// capabilities return ErrReadOnly.
	Write(ctx context.Context, v any) error
}

// PointHealth is implemented by points whose device can be marked down
// independently of the bus (a Modbus unit after N consecutive failures).
// While Health returns an error, the node serves the last good value as
// quality degraded, or error when there is none.
type PointHealth interface {
	Health() error
}

// BatchReader is implemented by a Bus that reads many of its points at
// once: the node's poll scheduler hands it every point of the bus that is
// due in a round, so a driver that can merge reads (Modbus: one request
// per span of registers, whatever capability each register belongs to)
// serves a device's hundreds of points in a few requests. ReadPoints reads
// points[i] within ctxs[i], reports each outcome once through done (on the
// calling goroutine, in any order) and returns when every point was
// reported. A point that is not the bus's own is read with its Read.
type BatchReader interface {
	ReadPoints(ctxs []context.Context, points []Point, done func(i int, r Reading, err error))
}

// Bus is an open connection to one named bus.
type Bus interface {
	// Point opens the binding of one capability on this bus; errors are
	// configuration errors and should name the binding key at fault.
	Point(c *manifest.Capability) (Point, error)
	// Health is nil while the bus is usable; otherwise it says why not.
	Health() error
	Close() error
}

// Factory opens a bus from its manifest entry. b.Config holds the bus's own
// keys, which the factory decodes strictly.
type Factory func(ctx context.Context, b *manifest.Bus) (Bus, error)

// Errors a point returns; wrap them with detail (fmt.Errorf("...: %w", ErrX)).
var (
	ErrOffline  = errors.New("device offline")
	ErrTimeout  = errors.New("device timeout")
	ErrReadOnly = errors.New("point is read-only")
	ErrBadValue = errors.New("value rejected by device")
)

// What a write error says about the device (the node's outcome vocabulary
// rests on it):
//   - errors.Is(err, ErrOffline), ErrBadValue or ErrReadOnly: the write
//     certainly changed nothing (never sent, or the device answered and
//     refused it);
//   - any other error: the write may have landed (sent, reply lost or late),
//     and the node reads the device back before it answers.

// Coded is implemented by errors that carry a machine code for agents
// ("illegal_data_address", "slave_device_busy", …) and a fix that fits it.
// The node puts the code in its answer.
type Coded interface {
	error
	Code() string
	Fix() string
}

// CodeOf returns the code and fix of the first Coded error in err's chain.
func CodeOf(err error) (code, fix string, ok bool) {
	var c Coded
	if errors.As(err, &c) {
		return c.Code(), c.Fix(), true
	}
	return "", "", false
}

// Quantizer is implemented by points whose encoding cannot hold every value
// of the capability's data type exactly (float32 registers, scaled
// integers). Quantize returns the value the device holds after v is
// written, so the node verifies a read-back against what can be there, or
// an error (wrapping ErrBadValue) that suggests a value it can hold.
type Quantizer interface {
	Quantize(v any) (any, error)
}

// Verifier is implemented by points whose device shows a write at another
// address (a Modbus verify point: the status input of a coil command, the
// active-setpoint register of a setpoint). The node's verifying read after
// a write calls Verify instead of Read.
type Verifier interface {
	// Verify reads the verify point (honouring ctx's deadline) and judges
	// it against a write of v. An error means the point could not be read,
	// so the write is unverified.
	Verify(ctx context.Context, v any) (Verification, error)
}

// Verification is what a verify point showed after a write.
type Verification struct {
	Point    string // what was read, for people: "unit 1 discrete input 20"
	Observed any    // the value it shows
	Expected any    // the value it shows when the write applied
	OK       bool   // Observed is Expected (within the verify tolerance)
	At       time.Time
}

// Driver is what a bus type registers: how to open a bus, and how to
// check a capability's binding without opening any hardware (validate,
// reload). The registry is the one list of drivers: the daemon, validate
// and the manifest schema all read it.
type Driver struct {
	Open Factory
	// Check validates a binding offline (nil: the bus is opened to check
	// it, as the simulator is).
	Check func(*manifest.Capability) error
	// CheckBus validates a bus entry's own keys offline (nil: they are
	// first decoded when the bus opens).
	CheckBus func(*manifest.Bus) error
	// Span, when set, also says where a binding's writes land, so that
	// two do_ capabilities on one address are refused offline (Spanner).
	Span func(*manifest.Capability) (Spanner, error)
}

var (
	mu      sync.RWMutex
	drivers = map[string]Driver{}
)

// Register makes a bus type available; drivers call it from init.
func Register(busType string, f Factory) { RegisterDriver(busType, Driver{Open: f}) }

// RegisterDriver is Register with the driver's offline checks.
func RegisterDriver(busType string, d Driver) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := drivers[busType]; dup {
		panic("drivers: Register called twice for " + busType)
	}
	if d.Open == nil {
		panic("drivers: no Open for " + busType)
	}
	drivers[busType] = d
}

// Lookup returns the factory for a bus type.
func Lookup(busType string) (Factory, bool) {
	d, ok := LookupDriver(busType)
	return d.Open, ok
}

// LookupDriver returns a bus type's driver.
func LookupDriver(busType string) (Driver, bool) {
	mu.RLock()
	defer mu.RUnlock()
	d, ok := drivers[busType]
	return d, ok
}

// Counters is implemented by buses that count their traffic (the Modbus
// engines); /metrics exports them per bus.
type Counters interface {
	Counters() BusCounters
}

// BusCounters is a bus engine's traffic so far.
type BusCounters struct {
	QueueDepth int   // requests waiting for the bus worker
	Requests   int64 // requests sent (a coalesced read counts once)
	Coalesced  int64 // point reads that shared another read's request
	Failures   int64 // requests that failed other than by a device exception
	Timeouts   int64 // requests without a timely reply
	Exceptions int64 // device exception replies
	// The device-watchdog heartbeat (a Modbus bus's heartbeat:), zero
	// without one.
	Heartbeats      int64 // heartbeat writes the device acknowledged
	HeartbeatErrors int64 // heartbeat and watchdog-time writes that failed
}

// Types lists the registered bus types, sorted.
func Types() []string {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]string, 0, len(drivers))
	for t := range drivers {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Open opens a bus by its manifest entry.
func Open(ctx context.Context, b *manifest.Bus) (Bus, error) {
	f, ok := Lookup(b.Type)
	if !ok {
		return nil, fmt.Errorf("bus %q: no driver for type %q (have %v)", b.Name, b.Type, Types())
	}
	return f(ctx, b)
}
