package gpio

import (
	"fmt"
	"strings"
	"time"

	"github.com/physd/physd/manifest"
	"periph.io/x/conn/v3/gpio"
)

// bindingKeys are the structured keys of a gpio binding (and the key=value
// parts of its address string). Pointers tell "absent" from a zero value.
type bindingKeys struct {
	Pin       *string        `yaml:"pin"`
	Mode      *string        `yaml:"mode"`
	Direction *string        `yaml:"direction"`
	ActiveLow *bool          `yaml:"active_low"`
	Pull      *string        `yaml:"pull"`
	Initial   *string        `yaml:"initial"`
	EdgeCount *edgeCountKeys `yaml:"edge_count"`
}

type edgeCountKeys struct {
	Edge       *string `yaml:"edge"`
	DebounceMS *int    `yaml:"debounce_ms"`
}

const maxDebounceMS = 10_000

// electrical is how a pin is configured. Every capability that binds the
// same pin must agree on it: there is one pin, and one configuration.
type electrical struct {
	out       bool
	activeLow bool
	pull      gpio.Pull  // inputs; PullNoChange when not given
	initial   bool       // outputs: the logical level driven at open
	counter   *countSpec // inputs with edge_count
}

// countSpec is an edge counter's configuration.
type countSpec struct {
	edge     gpio.Edge // logical edge, before active_low
	debounce time.Duration
}

// pinSpec is a validated binding.
type pinSpec struct {
	pin      string // as written
	elec     electrical
	counting bool // this capability reads the edge count, not the level
	writable bool
}

// parseBinding validates a capability's gpio binding without touching any
// pin, so it serves both Bus.Point and CheckBinding.
func parseBinding(c *manifest.Capability) (*pinSpec, error) {
	p := manifest.NewBindingErrors(c)
	if c.Binding.Type != "gpio" {
		p.Add("type", fmt.Sprintf("binding type %q on a gpio bus", c.Binding.Type), "use type: gpio, or bind the capability to a bus of type "+c.Binding.Type)
	}
	addrKeys, err := splitAddress(c.Binding.Address, c.Binding.Pos.Line, c.Binding.Pos.Col)
	if err != nil {
		p.Add("address", err.Error(), `write a PhysMCP address such as "pin=14:mode=digital", or use pin: GPIO17`)
		return nil, p.Errs
	}
	var k bindingKeys
	if errs := p.DecodeBinding(addrKeys, &k); len(errs) > 0 {
		return nil, errs
	}

	s := &pinSpec{writable: c.Kind == manifest.KindDo}
	if k.Pin == nil || strings.TrimSpace(*k.Pin) == "" {
		p.Add("pin", "required: which GPIO line", "add pin: GPIO17 (the BCM number; header pin 11)")
	} else {
		s.pin = strings.TrimSpace(*k.Pin)
	}
	if k.ActiveLow != nil {
		s.elec.activeLow = *k.ActiveLow
	}
	bindDirection(p, &k, s)
	bindPull(p, &k, s)
	bindInitial(p, &k, s)
	bindEdgeCount(p, &k, s)
	switch {
	case s.counting && c.DataType != manifest.TypeInt:
		p.AddCap("data_type", fmt.Sprintf("an edge counter reads a count, not data_type %q", c.DataType), "use data_type: int")
	case !s.counting && c.DataType != manifest.TypeBool:
		p.AddCap("data_type", fmt.Sprintf("a GPIO level is data_type bool, not %q", c.DataType), "use data_type: bool, or add edge_count with data_type: int to count pulses")
	}
	if len(p.Errs) > 0 {
		return nil, p.Errs
	}
	return s, nil
}

// bindDirection sets whether the pin is an output: from direction:, from
// mode:, or from the capability's kind. mode: counter implies edge_count.
func bindDirection(p *manifest.BindingErrors, k *bindingKeys, s *pinSpec) {
	s.elec.out = s.writable
	if k.Mode != nil {
		switch *k.Mode {
		case "digital":
		case "input", "in":
			s.elec.out = false
		case "output", "out":
			s.elec.out = true
		case "counter":
			if k.EdgeCount == nil {
				k.EdgeCount = &edgeCountKeys{}
			}
		default:
			p.Add("mode", fmt.Sprintf("mode %q is not supported by the gpio driver", *k.Mode), "use mode: digital (or input, output, counter)")
		}
	}
	if k.Direction != nil {
		switch *k.Direction {
		case "in":
			s.elec.out = false
		case "out":
			s.elec.out = true
		default:
			p.Add("direction", fmt.Sprintf("direction %q", *k.Direction), "use direction: in or direction: out")
		}
	}
	if s.writable && !s.elec.out {
		p.Add("direction", "a do capability drives the pin, so it must be an output", "use direction: out (or omit it)")
	}
}

// bindPull sets an input's pull resistor.
func bindPull(p *manifest.BindingErrors, k *bindingKeys, s *pinSpec) {
	if k.Pull == nil {
		return
	}
	switch *k.Pull {
	case "up":
		s.elec.pull = gpio.PullUp
	case "down":
		s.elec.pull = gpio.PullDown
	case "none", "float":
		s.elec.pull = gpio.Float
	default:
		p.Add("pull", fmt.Sprintf("pull %q", *k.Pull), "use pull: up, down or none")
	}
	if s.elec.out {
		p.Add("pull", "pull applies to inputs; this pin is an output", "remove pull")
	}
}

// bindInitial sets the logical level an output drives when the bus opens.
func bindInitial(p *manifest.BindingErrors, k *bindingKeys, s *pinSpec) {
	if k.Initial == nil {
		return
	}
	switch strings.ToLower(*k.Initial) {
	case "low", "off", "false":
	case "high", "on", "true":
		s.elec.initial = true
	default:
		p.Add("initial", fmt.Sprintf("initial %q", *k.Initial), "use initial: low (inactive) or initial: high (active)")
	}
	if !s.elec.out {
		p.Add("initial", "initial applies to outputs; this pin is an input", "remove initial, or set direction: out")
	}
}

// bindEdgeCount sets an input's edge counter: which edges, and the debounce.
func bindEdgeCount(p *manifest.BindingErrors, k *bindingKeys, s *pinSpec) {
	if k.EdgeCount == nil {
		return
	}
	s.counting = true
	cs := &countSpec{edge: gpio.RisingEdge}
	if e := k.EdgeCount.Edge; e != nil {
		switch *e {
		case "rising":
		case "falling":
			cs.edge = gpio.FallingEdge
		case "both":
			cs.edge = gpio.BothEdges
		default:
			p.Add("edge_count.edge", fmt.Sprintf("edge %q", *e), "use edge: rising, falling or both")
		}
	}
	if d := k.EdgeCount.DebounceMS; d != nil {
		if *d < 0 || *d > maxDebounceMS {
			p.Add("edge_count.debounce_ms", fmt.Sprintf("debounce_ms %d is outside 0..%d", *d, maxDebounceMS), "use the contact's bounce time, e.g. 5 (reed switches) or 0 (clean pulses)")
		}
		cs.debounce = time.Duration(*d) * time.Millisecond
	}
	s.elec.counter = cs
	if s.elec.out {
		p.Add("edge_count", "edge counting needs an input; this pin is an output", "use direction: in and kind: read")
	}
}

// CheckBinding validates a capability's gpio binding keys without opening a
// bus or touching a pin, for `physd validate`. Errors are manifest.Errors
// positioned at the key at fault.
func CheckBinding(c *manifest.Capability) error {
	_, err := parseBinding(c)
	return err
}
