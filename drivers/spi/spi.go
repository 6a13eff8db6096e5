// Package spi is physd's SPI driver: bus type "spi" on periph.io
// (conn/v3 spireg; /dev/spidevB.C through host/v3), with the parts physd
// knows as devices. Today that is the Microchip MCP3008/MCP3004 10-bit ADC
// (drivers/devices/mcp3008):
//
//	buses:
//	  adc: {type: spi, port: "/dev/spidev0.0"}    # or "SPI0.0", any name spireg knows
//	capabilities:
//	  - binding: {type: spi, bus: adc, profile: mcp3008, channel: 0, vref: 3.3}                # data_type float, volts
//	  - binding: {type: spi, bus: adc, profile: mcp3008, channel: 2, input: differential}      # CH2+ CH3−
//	  - binding: {type: spi, bus: adc, profile: mcp3008, channel: 5, scale: 30.3, offset: 0}  # a 0–100 % sensor behind a divider
//
// One chip per bus entry (the port names the chip select). Each read is
// one conversion; value = volts × scale + offset. A missing port does not
// stop the daemon: the bus is unavailable and /readyz says what to enable
// (dtparam=spi=on).
package spi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/devices/mcp3008"
	"github.com/physd/physd/drivers/periphhost"
	"github.com/physd/physd/manifest"
	"periph.io/x/conn/v3/spi"
	"periph.io/x/conn/v3/spi/spireg"
)

func init() { drivers.RegisterDriver("spi", drivers.Driver{Open: Open, Check: CheckBinding}) }

type busConfig struct {
	Port *string `yaml:"port"`
}

// Bus is one SPI port (one chip select).
type Bus struct {
	name string
	mu   sync.Mutex // one transaction at a time; guards the fields below
	port spi.PortCloser
	conn spi.Conn
	err  error
}

// Open is the drivers.Factory for bus type "spi".
func Open(_ context.Context, b *manifest.Bus) (drivers.Bus, error) {
	if b == nil {
		return nil, errors.New("spi: nil bus")
	}
	var cfg busConfig
	if errs := b.DecodeConfig(&cfg); len(errs) > 0 {
		return nil, errs
	}
	if cfg.Port == nil || strings.TrimSpace(*cfg.Port) == "" {
		return nil, manifest.Errors{&manifest.Error{Pos: b.Pos, Field: b.FieldPath() + ".port", Msg: "required: which SPI port (chip select)",
			Fix: `add port: "/dev/spidev0.0" (CE0 on the Raspberry Pi header; /dev/spidev0.1 is CE1)`}}
	}
	name := strings.TrimSpace(*cfg.Port)
	note := periphhost.Notes("spi")
	port, err := spireg.Open(name)
	if err != nil {
		var have []string
		for _, r := range spireg.All() {
			have = append(have, r.Name)
		}
		msg := fmt.Sprintf("spi port %q (buses.%s) cannot be opened (%v): is dtparam=spi=on set in /boot/firmware/config.txt (then reboot), and may this user open it (sudo usermod -aG spi $USER)? ports: %s",
			name, b.Name, err, strings.Join(have, ", "))
		if note != "" {
			msg += " (" + note + ")"
		}
		return nil, fmt.Errorf("%s: %w", msg, drivers.ErrOffline)
	}
	conn, err := port.Connect(mcp3008.MaxSpeed, mcp3008.Mode, 8)
	if err != nil {
		_ = port.Close()
		return nil, fmt.Errorf("spi port %q (buses.%s): connect at %v, %v: %v: %w", name, b.Name, mcp3008.MaxSpeed, mcp3008.Mode, err, drivers.ErrOffline)
	}
	return &Bus{name: b.Name, port: port, conn: conn}, nil
}

// Health is nil while the port is open.
func (b *Bus) Health() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.port == nil {
		return fmt.Errorf("spi %s: closed: %w", b.name, drivers.ErrOffline)
	}
	return nil
}

// Close closes the port; later reads fail with drivers.ErrOffline.
func (b *Bus) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.port == nil {
		return nil
	}
	err := b.port.Close()
	b.port, b.conn = nil, nil
	return err
}

type bindingKeys struct {
	Profile *string  `yaml:"profile"`
	Device  *string  `yaml:"device"` // refused: the part is named by profile:, as on i2c and modbus bindings
	Channel *int     `yaml:"channel"`
	Input   *string  `yaml:"input"`
	VRef    *float64 `yaml:"vref"`
	Scale   *float64 `yaml:"scale"`
	Offset  *float64 `yaml:"offset"`
}

type pointSpec struct {
	channel             int
	diff                bool
	vref, scale, offset float64
	dataType            string
}

func parseBinding(c *manifest.Capability) (*pointSpec, error) {
	p := manifest.NewBindingErrors(c)
	if c.Binding.Type != "spi" {
		p.Add("type", fmt.Sprintf("binding type %q on an spi bus", c.Binding.Type), "use type: spi")
	}
	if strings.TrimSpace(c.Binding.Address) != "" {
		p.Add("address", "an spi binding names its chip and channel with profile: and channel:, not an address", "remove address; the bus's port is the chip select")
	}
	var k bindingKeys
	if errs := p.DecodeBinding(nil, &k); len(errs) > 0 {
		return nil, errs
	}
	s := &pointSpec{vref: 3.3, scale: 1, dataType: c.DataType}
	part := ""
	switch {
	case k.Device != nil:
		p.Add("device", "the part on a binding is named with profile:, on spi as on i2c and modbus", "write profile: "+strings.TrimSpace(*k.Device))
	case k.Profile == nil:
		p.Add("profile", "required: which part is on this chip select", "add profile: mcp3008 (also for an MCP3004, channels 0..3)")
	default:
		part = strings.ToLower(strings.TrimSpace(*k.Profile))
		if part != "mcp3008" && part != "mcp3004" {
			p.Add("profile", fmt.Sprintf("no SPI device profile %q", *k.Profile), "use profile: mcp3008 or mcp3004")
		}
	}
	maxCh := 7
	if part == "mcp3004" {
		maxCh = 3
	}
	switch {
	case k.Channel == nil:
		p.Add("channel", "required: which input", fmt.Sprintf("add channel: 0..%d", maxCh))
	case *k.Channel < 0 || *k.Channel > maxCh:
		p.Add("channel", fmt.Sprintf("channel %d is outside 0..%d", *k.Channel, maxCh), fmt.Sprintf("use channel: 0..%d", maxCh))
	default:
		s.channel = *k.Channel
	}
	if k.Input != nil {
		switch strings.ToLower(strings.TrimSpace(*k.Input)) {
		case "single":
		case "differential":
			s.diff = true
		default:
			p.Add("input", fmt.Sprintf("input %q", *k.Input), "use input: single (against ground, the default) or differential (pairs 0/1, 2/3, ...: channel 0 is CH0+ CH1−, channel 1 is CH0− CH1+)")
		}
	}
	if k.VRef != nil {
		if *k.VRef <= 0 || *k.VRef > 5.5 || math.IsNaN(*k.VRef) {
			p.Add("vref", fmt.Sprintf("vref %v V is outside the part's 0..5.5 V", *k.VRef), "use the voltage on the V_REF pin, e.g. 3.3")
		} else {
			s.vref = *k.VRef
		}
	}
	s.scale = p.Scale(k.Scale, 1, "use units per volt, e.g. 30.3")
	if k.Offset != nil {
		s.offset = *k.Offset
	}
	p.ReadOnlyNumber("an ADC input is read-only", "an ADC reads a number", "use data_type float")
	if len(p.Errs) > 0 {
		return nil, p.Errs
	}
	return s, nil
}

// CheckBinding validates an spi binding without opening the port, for
// `physd validate`.
func CheckBinding(c *manifest.Capability) error {
	_, err := parseBinding(c)
	return err
}

// Point opens a capability's binding.
func (b *Bus) Point(c *manifest.Capability) (drivers.Point, error) {
	if c == nil {
		return nil, errors.New("spi: nil capability")
	}
	s, err := parseBinding(c)
	if err != nil {
		return nil, err
	}
	return &point{b: b, s: s, what: fmt.Sprintf("spi %s mcp3008 channel %d", b.name, s.channel)}, nil
}

type point struct {
	b    *Bus
	s    *pointSpec
	what string
}

// Read converts the channel once.
func (p *point) Read(ctx context.Context) (drivers.Reading, error) {
	if err := ctx.Err(); err != nil {
		return drivers.Reading{}, fmt.Errorf("%s: %w (%w)", p.what, drivers.ErrTimeout, err)
	}
	p.b.mu.Lock()
	conn := p.b.conn
	var code int
	err := fmt.Errorf("%s: bus closed: %w", p.what, drivers.ErrOffline)
	if conn != nil {
		code, err = mcp3008.Read(conn, p.s.channel, p.s.diff)
		if err != nil {
			err = fmt.Errorf("%s: %w (%w)", p.what, drivers.ErrOffline, err)
		}
	}
	p.b.mu.Unlock()
	if err != nil {
		return drivers.Reading{}, err
	}
	v := mcp3008.Volts(code, p.s.vref)*p.s.scale + p.s.offset
	if p.s.dataType == manifest.TypeInt {
		return drivers.Reading{Value: int64(math.Round(v)), At: time.Now()}, nil
	}
	return drivers.Reading{Value: v, At: time.Now()}, nil
}

// Write: ADC inputs are read-only.
func (p *point) Write(context.Context, any) error {
	return fmt.Errorf("%s: an ADC input cannot be written: %w", p.what, drivers.ErrReadOnly)
}
