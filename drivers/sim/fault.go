package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/physd/physd/drivers"
)

// FaultMode selects how a point misbehaves.
type FaultMode int

// Fault modes.
const (
	// FaultNone clears the point's fault.
	FaultNone FaultMode = iota
	// FaultOffline: reads and writes fail with an error wrapping
	// drivers.ErrOffline.
	FaultOffline
	// FaultStuck: reads return the value frozen when the fault was set;
	// writes return nil but have no effect (a read-back verify fails).
	FaultStuck
	// FaultNoisy: reads get uniform noise in ±Noise added.
	FaultNoisy
	// FaultSlow: each read and write first waits Delay, honouring ctx; when
	// ctx expires first the call fails with an error wrapping
	// drivers.ErrTimeout.
	FaultSlow
)

var faultModeNames = [...]string{"none", "offline", "stuck", "noisy", "slow"}

func (m FaultMode) String() string {
	if m >= 0 && int(m) < len(faultModeNames) {
		return faultModeNames[m]
	}
	return fmt.Sprintf("FaultMode(%d)", int(m))
}

// ParseFaultMode parses "none", "offline", "stuck", "noisy" or "slow".
func ParseFaultMode(s string) (FaultMode, error) {
	for i, n := range faultModeNames {
		if s == n {
			return FaultMode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown fault mode %q (want one of %s)", s, strings.Join(faultModeNames[:], ", "))
}

// MarshalText implements encoding.TextMarshaler.
func (m FaultMode) MarshalText() ([]byte, error) {
	if m < 0 || int(m) >= len(faultModeNames) {
		return nil, fmt.Errorf("invalid fault mode %d", int(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *FaultMode) UnmarshalText(b []byte) error {
	v, err := ParseFaultMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Fault is an injected misbehaviour of one point (or of all points, "*").
// Delay is used by FaultSlow only, Noise by FaultNoisy only.
type Fault struct {
	Mode  FaultMode
	Delay time.Duration
	Noise float64
}

// faultJSON is the wire shape of a Fault (control handler and MarshalJSON).
type faultJSON struct {
	Mode    FaultMode `json:"mode"`
	DelayMS int64     `json:"delay_ms"`
	Noise   float64   `json:"noise"`
}

// MarshalJSON encodes {"mode":"slow","delay_ms":250,"noise":0}.
func (f Fault) MarshalJSON() ([]byte, error) {
	return json.Marshal(faultJSON{Mode: f.Mode, DelayMS: f.Delay.Milliseconds(), Noise: f.Noise})
}

// UnmarshalJSON decodes the shape MarshalJSON writes.
func (f *Fault) UnmarshalJSON(b []byte) error {
	var j faultJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*f = Fault{Mode: j.Mode, Delay: time.Duration(j.DelayMS) * time.Millisecond, Noise: j.Noise}
	return nil
}

func (f Fault) validate() error {
	switch f.Mode {
	case FaultNone, FaultOffline, FaultStuck:
	case FaultNoisy:
		if !(f.Noise > 0) || math.IsInf(f.Noise, 0) {
			return fmt.Errorf("noisy fault needs noise > 0, got %v", f.Noise)
		}
	case FaultSlow:
		if f.Delay <= 0 {
			return fmt.Errorf("slow fault needs a delay > 0, got %v", f.Delay)
		}
	default:
		return fmt.Errorf("invalid fault mode %d", int(f.Mode))
	}
	return nil
}

type faultState struct {
	Fault
	frozen []float64 // FaultStuck: value per signal index when the fault was set
}

// AllPoints is the point name SetFault takes for a plant-wide fault.
const AllPoints = "*"

// SetFault injects f at point (a point name such as "zone_a.temperature", or
// "*" for every point). Each point has at most one fault, replaced by the
// next SetFault; the "*" fault applies in addition to the point's own.
// Mode FaultNone removes the fault.
func (p *Plant) SetFault(point string, f Fault) error {
	if err := f.validate(); err != nil {
		return fmt.Errorf("sim %s: %s: %w", p.name, point, err)
	}
	idx := -1
	if point != AllPoints {
		i, ok := p.byName[point]
		if !ok {
			return fmt.Errorf("sim %s: unknown point %q (have %s, or %q for all)", p.name, point, strings.Join(p.Points(), ", "), AllPoints)
		}
		idx = i
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if f.Mode == FaultNone {
		if idx < 0 {
			p.global = nil
		} else {
			delete(p.faults, idx)
		}
		return nil
	}
	fs := &faultState{Fault: f}
	if f.Mode == FaultStuck {
		now := time.Now()
		p.advance(now)
		fs.frozen = make([]float64, len(p.sigs))
		for i := range p.sigs {
			if idx < 0 || i == idx {
				fs.frozen[i] = p.sensed(&p.sigs[i], now)
			}
		}
	}
	if idx < 0 {
		p.global = fs
	} else {
		p.faults[idx] = fs
	}
	return nil
}

// ClearFaults removes every injected fault, including "*".
func (p *Plant) ClearFaults() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.global = nil
	clear(p.faults)
}

// Faults returns the active faults by point name ("*" for the plant-wide one).
func (p *Plant) Faults() map[string]Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]Fault, len(p.faults)+1)
	for i, fs := range p.faults {
		out[p.sigs[i].name] = fs.Fault
	}
	if p.global != nil {
		out[AllPoints] = p.global.Fault
	}
	return out
}

// faultsFor returns the point's own fault and the plant-wide one (either may
// be nil). p.mu must be held.
func (p *Plant) faultsFor(i int) (own, all *faultState) {
	return p.faults[i], p.global
}

// delayFor is latency_ms plus any slow faults. p.mu must be held.
func (p *Plant) delayFor(i int) time.Duration {
	d := p.latency
	own, all := p.faultsFor(i)
	if own != nil && own.Mode == FaultSlow {
		d += own.Delay
	}
	if all != nil && all.Mode == FaultSlow {
		d += all.Delay
	}
	return d
}

// offline reports whether reads and writes of signal i fail. p.mu must be held.
func (p *Plant) offline(i int) error {
	if p.closed {
		return fmt.Errorf("sim %s: %s: bus closed: %w", p.name, p.sigs[i].name, drivers.ErrOffline)
	}
	own, all := p.faultsFor(i)
	if own != nil && own.Mode == FaultOffline {
		return fmt.Errorf("sim %s: %s: injected fault: %w", p.name, p.sigs[i].name, drivers.ErrOffline)
	}
	if all != nil && all.Mode == FaultOffline {
		return fmt.Errorf("sim %s: %s: injected plant-wide fault: %w", p.name, p.sigs[i].name, drivers.ErrOffline)
	}
	return nil
}

// stuck reports whether signal i is stuck, and its frozen value. p.mu must be held.
func (p *Plant) stuck(i int) (float64, bool) {
	own, all := p.faultsFor(i)
	if own != nil && own.Mode == FaultStuck {
		return own.frozen[i], true
	}
	if all != nil && all.Mode == FaultStuck {
		return all.frozen[i], true
	}
	return 0, false
}

// noise is the injected read noise for signal i's n-th read. p.mu must be held.
func (p *Plant) noise(i int, n uint64) float64 {
	own, all := p.faultsFor(i)
	var v float64
	if own != nil && own.Mode == FaultNoisy {
		v += own.Noise * unitNoise(uint64(p.seed)^0x6e6f697379, p.sigs[i].hash, n)
	}
	if all != nil && all.Mode == FaultNoisy {
		v += all.Noise * unitNoise(uint64(p.seed)^0x616c6c, p.sigs[i].hash, n)
	}
	return v
}
