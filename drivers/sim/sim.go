// Package sim is the built-in simulated greenhouse plant: bus type "sim",
// the default that lets physd run with no hardware.
//
// A plant is declared under buses: in the manifest:
//
//	buses:
//	  plant:
//	    type: sim
//	    seed: 7            # noise seed (default 0)
//	    latency_ms: 0      # per read/write (default 0: instant)
//	    sensor_noise: 1    # scale of temperature/humidity sensor noise (0: exact)
//	    zones:  {zone_a: {ambient_c, initial_c, initial_rh, tau_s, heater_gain_c,
//	                      fan_cooling_c, vent_cooling_c, ambient_rh}}
//	    tanks:  {rain_tank: {capacity_l, initial_l, inflow_lpm}}
//	    valves: {irrigation_a: {travel_ms, flow_lpm, drains: rain_tank, initial}}
//
// Every key is optional; a plant that declares no zones, tanks or valves
// gets zone_a, zone_b, zone_c, rain_tank and irrigation_a (draining
// rain_tank). Capabilities bind with {type: sim, bus: plant, point: <object>.<signal>}
// or the PhysMCP address string "<object>.<signal>":
//
//	zone:  <z>.temperature (°C, read), <z>.humidity (%RH, read),
//	       <z>.heater, <z>.fan, <z>.vent (0..100 %, read+write: the commanded value)
//	valve: <v>.command (0..100 %, read+write), <v>.position (0..100 %, read)
//	tank:  <t>.level (litres, read)
//
// The physics is integrated lazily on each access from the last access to
// time.Now(), in closed form where inputs are constant, so an idle plant
// costs nothing, any gap costs O(1), and tests can drive it with
// testing/synctest. Faults can be injected at runtime (SetFault) and through
// the HTTP ControlHandler.
package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/strictyaml"
	"gopkg.in/yaml.v3"
)

func init() { drivers.Register("sim", Open) }

// Plant is an open simulated greenhouse. It is safe for concurrent use.
type Plant struct {
	name        string
	seed        int64
	latency     time.Duration
	sensorNoise float64

	// Immutable after Open.
	sigs   []signal
	byName map[string]int
	points []string // sorted names

	mu      sync.Mutex
	last    time.Time
	closed  bool
	zones   []zone
	tanks   []tank
	valves  []valve
	stats   []PointStats
	faults  map[int]*faultState
	global  *faultState
	scratch []float64
}

// PointStats counts the calls that reached a point: every Read, and every
// Write that passed the kind and value checks (including those that then
// failed on a fault, a timeout, or were swallowed by a stuck fault).
type PointStats struct {
	Reads  uint64 `json:"reads"`
	Writes uint64 `json:"writes"`
}

// Stats are the plant's counters: per point, and the totals.
type Stats struct {
	Points map[string]PointStats `json:"points"`
	Reads  uint64                `json:"reads"`
	Writes uint64                `json:"writes"`
}

var _ drivers.Bus = (*Plant)(nil)

// Open opens a sim bus from its manifest entry; it is the drivers.Factory
// registered as "sim". Config errors are manifest.Errors, each positioned
// file:line:col in b.Pos.File and named buses.<name>.<key>.
func Open(_ context.Context, b *manifest.Bus) (drivers.Bus, error) {
	p, err := New(b)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// New is Open with the concrete type, for tests and the daemon's
// --sim-control wiring.
func New(b *manifest.Bus) (*Plant, error) {
	if b == nil {
		return nil, errors.New("sim: nil bus")
	}
	root := b.FieldPath()
	spec, err := parseConfig(b.Pos.File, root, b.Config)
	if err != nil {
		return nil, err
	}
	return newPlant(b.Name, spec), nil
}

func newPlant(name string, spec *plantSpec) *Plant {
	p := &Plant{
		name:        name,
		seed:        spec.seed,
		latency:     time.Duration(spec.latencyMS) * time.Millisecond,
		sensorNoise: spec.sensorNoise,
		byName:      map[string]int{},
		faults:      map[int]*faultState{},
		last:        time.Now(),
	}
	add := func(obj objKind, idx int, object string, kind sigKind, sig, unit string, writable, percent bool, noise float64) {
		n := object + "." + sig
		p.byName[n] = len(p.sigs)
		p.sigs = append(p.sigs, signal{
			name: n, obj: obj, idx: idx, kind: kind, writable: writable,
			percent: percent, noiseAmp: noise, hash: fnv64(n), unit: unit,
		})
	}
	for i, z := range spec.zones {
		p.zones = append(p.zones, zone{zoneSpec: z, temp: z.initialC, rh: z.initialRH})
		add(objZone, i, z.name, sigTemperature, "temperature", "celsius", false, false, tempNoiseC)
		add(objZone, i, z.name, sigHumidity, "humidity", "percent", false, false, rhNoise)
		add(objZone, i, z.name, sigHeater, "heater", "percent", true, true, 0)
		add(objZone, i, z.name, sigFan, "fan", "percent", true, true, 0)
		add(objZone, i, z.name, sigVent, "vent", "percent", true, true, 0)
	}
	tankIdx := map[string]int{}
	for i, t := range spec.tanks {
		tankIdx[t.name] = i
		p.tanks = append(p.tanks, tank{tankSpec: t, level: t.initialL})
		add(objTank, i, t.name, sigLevel, "level", "litre", false, false, 0)
	}
	for i, v := range spec.valves {
		ti := -1
		if v.drains != "" {
			ti = tankIdx[v.drains]
		}
		p.valves = append(p.valves, valve{
			valveSpec: v, tank: ti, rate: 100 / (float64(v.travelMS) / 1000),
			cmd: v.initial, pos: v.initial,
		})
		add(objValve, i, v.name, sigCommand, "command", "percent", true, true, 0)
		add(objValve, i, v.name, sigPosition, "position", "percent", false, true, 0)
	}
	p.stats = make([]PointStats, len(p.sigs))
	for n := range p.byName {
		p.points = append(p.points, n)
	}
	sort.Strings(p.points)
	return p
}

// Name is the bus name.
func (p *Plant) Name() string { return p.name }

// Points lists every point name, sorted.
func (p *Plant) Points() []string { return append([]string(nil), p.points...) }

// Health is nil unless a plant-wide ("*") offline fault is active or the
// plant is closed; then the error wraps drivers.ErrOffline.
func (p *Plant) Health() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("sim %s: closed: %w", p.name, drivers.ErrOffline)
	}
	if p.global != nil && p.global.Mode == FaultOffline {
		return fmt.Errorf("sim %s: injected plant-wide fault: %w", p.name, drivers.ErrOffline)
	}
	return nil
}

// Close marks the plant closed; later reads and writes fail with
// drivers.ErrOffline. It is idempotent and always returns nil.
func (p *Plant) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

// Snapshot returns every signal's current physical value by point name,
// without sensor noise or injected faults.
func (p *Plant) Snapshot() map[string]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.advance(time.Now())
	out := make(map[string]float64, len(p.sigs))
	for i := range p.sigs {
		out[p.sigs[i].name] = p.trueValue(&p.sigs[i])
	}
	return out
}

// Stats returns the read and write counters.
func (p *Plant) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Stats{Points: make(map[string]PointStats, len(p.sigs))}
	for i, ps := range p.stats {
		s.Points[p.sigs[i].name] = ps
		s.Reads += ps.Reads
		s.Writes += ps.Writes
	}
	return s
}

// Point opens a capability's binding. The point is taken from the binding's
// structured key point: or, failing that, its address string. Errors are
// manifest.Errors naming the binding key.
func (p *Plant) Point(c *manifest.Capability) (drivers.Point, error) {
	if c == nil {
		return nil, errors.New("sim: nil capability")
	}
	file := c.Binding.Pos.File
	if file == "" {
		file = c.Pos.File
	}
	root := c.Binding.Field
	if root == "" {
		root = "capabilities." + c.Name + ".binding"
	}
	bad := func(n *yaml.Node, key, msg, fix string) error {
		e := &manifest.Error{Pos: manifest.Pos{File: file}, Field: root, Msg: msg, Fix: fix}
		if key != "" {
			e.Field += "." + key
		}
		switch {
		case n != nil:
			e.Pos.Line, e.Pos.Col = n.Line, n.Column
		case c.Binding.Pos.Line > 0:
			e.Pos.Line, e.Pos.Col = c.Binding.Pos.Line, c.Binding.Pos.Col
		default:
			e.Pos.Line, e.Pos.Col = c.Pos.Line, c.Pos.Col
		}
		return manifest.Errors{e}
	}
	// badCap reports a problem with one of the capability's own keys.
	badCap := func(key, msg, fix string) error {
		return manifest.Errors{{
			Pos:   manifest.Pos{File: file, Line: c.Pos.Line, Col: c.Pos.Col},
			Field: strings.TrimSuffix(root, ".binding") + "." + key, Msg: msg, Fix: fix,
		}}
	}

	var params bindingParams
	keys := c.Binding.ParamsNode()
	if errs := strictyaml.Decode(file, keys, root, &params); len(errs) > 0 {
		return nil, errs
	}
	name, key, at := c.Binding.Address, "address", (*yaml.Node)(nil)
	if params.Point != nil {
		_, at = strictyaml.Lookup(keys, "point")
		if name != "" && name != *params.Point {
			return nil, bad(at, "point", fmt.Sprintf("point %q and address %q disagree", *params.Point, name),
				"keep one of them, or make them the same")
		}
		name, key = *params.Point, "point"
	}
	if name == "" {
		return nil, bad(nil, "", "a sim binding needs a point",
			"add point: <object>.<signal>, e.g. point: "+p.firstPoint())
	}
	i, ok := p.byName[name]
	if !ok {
		return nil, bad(at, key, fmt.Sprintf("unknown point %q on sim bus %q", name, p.name), p.pointFix(name))
	}
	s := &p.sigs[i]
	switch c.Kind {
	case manifest.KindRead:
	case manifest.KindDo:
		if !s.writable {
			return nil, bad(at, key, fmt.Sprintf("point %q is a measurement and cannot be written by a do capability", name),
				"bind do capabilities to a writable point ("+strings.Join(p.writablePoints(), ", ")+"), or make this a read capability")
		}
	default:
		return nil, badCap("kind", fmt.Sprintf("capability kind %q is not read or do", c.Kind), "use kind: read or kind: do")
	}
	switch c.DataType {
	case manifest.TypeFloat, manifest.TypeInt:
	case manifest.TypeBool:
		if !s.percent {
			return nil, badCap("data_type", fmt.Sprintf("point %q (%s) cannot be a bool", name, s.unit),
				"use data_type: float or int; bool suits 0..100 % points such as heaters and valves")
		}
	default:
		return nil, badCap("data_type", fmt.Sprintf("data_type %q is not supported by the sim plant (point %q)", c.DataType, name),
			"use data_type: float, int or bool")
	}
	return &point{p: p, sig: i, name: name, dataType: c.DataType, do: c.Kind == manifest.KindDo}, nil
}

func (p *Plant) firstPoint() string {
	if len(p.points) == 0 {
		return "zone_a.temperature"
	}
	return p.points[0]
}

func (p *Plant) writablePoints() []string {
	var w []string
	for _, n := range p.points {
		if p.sigs[p.byName[n]].writable {
			w = append(w, n)
		}
	}
	return w
}

// pointFix suggests the signals of a known object, or every point.
func (p *Plant) pointFix(name string) string {
	obj, _, _ := strings.Cut(name, ".")
	var same []string
	for _, n := range p.points {
		if strings.HasPrefix(n, obj+".") {
			same = append(same, n)
		}
	}
	if len(same) > 0 {
		return "use one of " + strings.Join(same, ", ")
	}
	if len(p.points) == 0 {
		return "declare zones, tanks or valves under buses." + p.name
	}
	return "use one of " + strings.Join(p.points, ", ")
}

// point is one opened binding.
type point struct {
	p        *Plant
	sig      int
	name     string
	dataType string
	do       bool
}

var (
	_ drivers.Point   = (*point)(nil)
	_ drivers.Spanner = (*point)(nil)
)

// WriteSpan is the plant's signal this point writes.
func (pt *point) WriteSpan() (string, uint64, uint64, string) {
	return "sim plant " + pt.p.name, uint64(pt.sig), 1, "the point " + pt.name
}

func (pt *point) timeout(err error) error {
	return fmt.Errorf("sim %s: %s: %w (%w)", pt.p.name, pt.name, drivers.ErrTimeout, err)
}

func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Read observes the point, normalised to the capability's data type.
func (pt *point) Read(ctx context.Context) (drivers.Reading, error) {
	if err := ctx.Err(); err != nil {
		return drivers.Reading{}, pt.timeout(err)
	}
	p := pt.p
	p.mu.Lock()
	p.stats[pt.sig].Reads++
	n := p.stats[pt.sig].Reads
	if err := p.offline(pt.sig); err != nil {
		p.mu.Unlock()
		return drivers.Reading{}, err
	}
	if d := p.delayFor(pt.sig); d > 0 {
		p.mu.Unlock()
		if err := wait(ctx, d); err != nil {
			return drivers.Reading{}, pt.timeout(err)
		}
		p.mu.Lock()
		if err := p.offline(pt.sig); err != nil {
			p.mu.Unlock()
			return drivers.Reading{}, err
		}
	}
	now := time.Now()
	p.advance(now)
	v, stuck := p.stuck(pt.sig)
	if !stuck {
		v = p.sensed(&p.sigs[pt.sig], now)
	}
	v += p.noise(pt.sig, n)
	p.mu.Unlock()
	return drivers.Reading{Value: pt.normalise(v), At: now}, nil
}

func (pt *point) normalise(v float64) any {
	switch pt.dataType {
	case manifest.TypeInt:
		return int64(math.Round(v))
	case manifest.TypeBool:
		return v >= 50
	}
	return v
}

// percent converts a written value to 0..100 %.
func (pt *point) percent(v any) (float64, error) {
	var f float64
	switch pt.dataType {
	case manifest.TypeBool:
		b, ok := v.(bool)
		if !ok {
			return 0, fmt.Errorf("sim %s: %s: want a bool, got %T: %w", pt.p.name, pt.name, v, drivers.ErrBadValue)
		}
		if b {
			return 100, nil
		}
		return 0, nil
	case manifest.TypeInt:
		switch x := v.(type) {
		case int64:
			f = float64(x)
		case int:
			f = float64(x)
		case int32:
			f = float64(x)
		case float64:
			if x != math.Trunc(x) {
				return 0, fmt.Errorf("sim %s: %s: want an integer, got %v: %w", pt.p.name, pt.name, x, drivers.ErrBadValue)
			}
			f = x
		default:
			return 0, fmt.Errorf("sim %s: %s: want an integer, got %T: %w", pt.p.name, pt.name, v, drivers.ErrBadValue)
		}
	default: // float
		switch x := v.(type) {
		case float64:
			f = x
		case float32:
			f = float64(x)
		case int64:
			f = float64(x)
		case int:
			f = float64(x)
		default:
			return 0, fmt.Errorf("sim %s: %s: want a number, got %T: %w", pt.p.name, pt.name, v, drivers.ErrBadValue)
		}
	}
	if !(f >= 0 && f <= 100) { // also rejects NaN
		return 0, fmt.Errorf("sim %s: %s: %v is outside 0..100 %%: %w", pt.p.name, pt.name, v, drivers.ErrBadValue)
	}
	return f, nil
}

// Write commands v. Points opened for read capabilities return
// drivers.ErrReadOnly; values that are not 0..100 % (or of the wrong Go
// type) return drivers.ErrBadValue.
func (pt *point) Write(ctx context.Context, v any) error {
	p := pt.p
	if !pt.do {
		return fmt.Errorf("sim %s: %s: opened for a read capability: %w", p.name, pt.name, drivers.ErrReadOnly)
	}
	f, err := pt.percent(v)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return pt.timeout(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats[pt.sig].Writes++
	if err := p.offline(pt.sig); err != nil {
		return err
	}
	if d := p.delayFor(pt.sig); d > 0 {
		p.mu.Unlock()
		err := wait(ctx, d)
		p.mu.Lock()
		if err != nil {
			return pt.timeout(err)
		}
		if err := p.offline(pt.sig); err != nil {
			return err
		}
	}
	if _, stuck := p.stuck(pt.sig); stuck {
		return nil // swallowed: the device acknowledged but did not move
	}
	p.advance(time.Now())
	p.set(&p.sigs[pt.sig], f)
	return nil
}
