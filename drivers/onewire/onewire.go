// Package onewire is physd's 1-Wire driver: bus type "onewire", reading
// temperature sensors (DS18B20 and the other w1-therm parts) through the
// Linux kernel's w1 sysfs interface, the way Raspberry Pi images expose
// them (dtoverlay=w1-gpio in /boot/firmware/config.txt; data on GPIO4 with
// a 4.7 kΩ pull-up to 3.3 V):
//
//	buses:
//	  w1: {type: onewire}                          # path: /sys/bus/w1/devices by default
//	capabilities:
//	  - binding: {type: onewire, bus: w1, address: "28-0316a2794bff"}   # data_type float, °C
//	  - binding: {type: onewire, bus: w1, address: "28-0316a2794c0a", offset: -0.3}  # a calibrated probe
//
// A read opens <path>/<id>/w1_slave, which makes the kernel run one
// conversion (up to 750 ms at 12-bit resolution) and return the scratchpad
// with its CRC; a CRC failure or the 85 °C power-on value is an error,
// never a temperature (package drivers/devices/ds18b20 decodes it). Reads
// of one bus are serialised (the kernel holds the bus for each
// conversion anyway) and bounded by the capability's timeout_ms.
package onewire

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/devices/ds18b20"
	"github.com/physd/physd/manifest"
)

func init() { drivers.RegisterDriver("onewire", drivers.Driver{Open: Open, Check: CheckBinding}) }

// DefaultPath is where the kernel lists 1-Wire devices.
const DefaultPath = "/sys/bus/w1/devices"

type busConfig struct {
	Path *string `yaml:"path"`
}

type bindingKeys struct {
	Scale  *float64 `yaml:"scale"`
	Offset *float64 `yaml:"offset"`
}

// Bus is one w1 sysfs directory.
type Bus struct {
	name string
	path string
	lock chan struct{}
}

// Open is the drivers.Factory for bus type "onewire". A missing w1
// directory is an error wrapping drivers.ErrOffline that says what to
// enable.
func Open(_ context.Context, b *manifest.Bus) (drivers.Bus, error) {
	if b == nil {
		return nil, errors.New("onewire: nil bus")
	}
	var cfg busConfig
	if errs := b.DecodeConfig(&cfg); len(errs) > 0 {
		return nil, errs
	}
	path := DefaultPath
	if cfg.Path != nil && strings.TrimSpace(*cfg.Path) != "" {
		path = strings.TrimSpace(*cfg.Path)
	}
	bus := &Bus{name: b.Name, path: path, lock: make(chan struct{}, 1)}
	if err := bus.Health(); err != nil {
		return nil, err
	}
	return bus, nil
}

// Health is nil while the w1 directory exists.
func (b *Bus) Health() error {
	if st, err := os.Stat(b.path); err != nil || !st.IsDir() {
		return fmt.Errorf("onewire bus %q: %s is missing: add dtoverlay=w1-gpio to /boot/firmware/config.txt and reboot (or sudo modprobe w1-gpio w1-therm): %w",
			b.name, b.path, drivers.ErrOffline)
	}
	return nil
}

// Close has nothing to release.
func (b *Bus) Close() error { return nil }

type pointSpec struct {
	id, part      string
	scale, offset float64
	dataType      string
}

func parseBinding(c *manifest.Capability) (*pointSpec, error) {
	p := manifest.NewBindingErrors(c)
	if c.Binding.Type != "onewire" {
		p.Add("type", fmt.Sprintf("binding type %q on a onewire bus", c.Binding.Type), "use type: onewire")
	}
	var k bindingKeys
	if errs := p.DecodeBinding(nil, &k); len(errs) > 0 {
		return nil, errs
	}
	s := &pointSpec{id: strings.TrimSpace(c.Binding.Address), scale: 1, dataType: c.DataType}
	if s.id == "" {
		p.Add("address", "required: the sensor's 1-Wire id", `add address: "28-0316a2794bff" (ls /sys/bus/w1/devices lists the sensors)`)
	} else if part, err := ds18b20.CheckID(s.id); err != nil {
		p.Add("address", err.Error(), "use the directory name the kernel shows under /sys/bus/w1/devices")
	} else {
		s.part = part
	}
	s.scale = p.Scale(k.Scale, 1, "use e.g. scale: 1.8 with offset: 32 for °F")
	if k.Offset != nil {
		s.offset = *k.Offset
	}
	p.ReadOnlyNumber("a 1-Wire temperature sensor is read-only", "a 1-Wire sensor reads a temperature", "use data_type float (°C)")
	if len(p.Errs) > 0 {
		return nil, p.Errs
	}
	return s, nil
}

// CheckBinding validates a onewire binding without touching the bus, for
// `physd validate`.
func CheckBinding(c *manifest.Capability) error {
	_, err := parseBinding(c)
	return err
}

// Point opens a capability's binding.
func (b *Bus) Point(c *manifest.Capability) (drivers.Point, error) {
	if c == nil {
		return nil, errors.New("onewire: nil capability")
	}
	s, err := parseBinding(c)
	if err != nil {
		return nil, err
	}
	return &point{b: b, s: s}, nil
}

type point struct {
	b *Bus
	s *pointSpec
}

// Read runs one conversion through the kernel and returns °C (scaled).
func (p *point) Read(ctx context.Context) (drivers.Reading, error) {
	what := fmt.Sprintf("onewire %s %s (%s)", p.b.name, p.s.id, p.s.part)
	select {
	case p.b.lock <- struct{}{}:
	case <-ctx.Done():
		return drivers.Reading{}, fmt.Errorf("%s: waiting for the bus: %w (%w)", what, drivers.ErrTimeout, ctx.Err())
	}
	type result struct {
		data []byte
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		// The read blocks in the kernel for the conversion; the lock is
		// released when it returns, even if the caller gave up.
		defer func() { <-p.b.lock }()
		data, err := os.ReadFile(filepath.Join(p.b.path, p.s.id, "w1_slave"))
		ch <- result{data, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		return drivers.Reading{}, fmt.Errorf("%s: the conversion did not finish: %w (%w)", what, drivers.ErrTimeout, ctx.Err())
	}
	if errors.Is(r.err, os.ErrNotExist) {
		return drivers.Reading{}, fmt.Errorf("%s: not on the bus (no %s): check its wiring; ls %s lists the sensors the kernel sees: %w",
			what, filepath.Join(p.b.path, p.s.id), p.b.path, drivers.ErrOffline)
	}
	if r.err != nil {
		return drivers.Reading{}, fmt.Errorf("%s: %w (%w)", what, drivers.ErrOffline, r.err)
	}
	c, err := ds18b20.Parse(r.data)
	if err != nil {
		return drivers.Reading{}, fmt.Errorf("%s: %w", what, err)
	}
	v := c*p.s.scale + p.s.offset
	if p.s.dataType == manifest.TypeInt {
		return drivers.Reading{Value: int64(math.Round(v)), At: time.Now()}, nil
	}
	return drivers.Reading{Value: v, At: time.Now()}, nil
}

// Write: sensors are read-only.
func (p *point) Write(context.Context, any) error {
	return fmt.Errorf("onewire %s: a temperature sensor cannot be written: %w", p.s.id, drivers.ErrReadOnly)
}
