package i2c

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/physd/physd/drivers/devices/ads1115"
	"github.com/physd/physd/drivers/devices/bme280"
	"github.com/physd/physd/drivers/devices/mcp9808"
	"github.com/physd/physd/manifest"
	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/physic"
)

// Device profiles: profile: <part> on an i2c binding reads the part
// through its device driver (drivers/devices/<part>), which knows its id
// registers, calibration and conversions, instead of raw registers:
//
//	binding: {type: i2c, bus: i2c1, address: 0x76, profile: bme280, point: humidity}
//	binding: {type: i2c, bus: i2c1, address: 0x18, profile: mcp9808, point: temperature}
//	binding: {type: i2c, bus: i2c1, address: 0x48, profile: ads1115, point: ain0, full_scale_v: 4.096, data_rate_sps: 128}
//
// scale and offset still apply (value = reading*scale + offset, e.g.
// scale: 0.01 for hPa, or a sensor's volts-to-units line on an ADS1115).
// Each read checks the chip's id registers (so a swapped or wrong part is
// an error, never a wrong number) and runs the part's own measurement.

// i2cProfile describes one part.
type i2cProfile struct {
	points []string // point names, first the default
	addrs  []uint16 // the addresses the part can have
	unit   string   // of each point, for messages
}

var i2cProfiles = map[string]i2cProfile{
	"bme280":  {points: []string{"temperature", "pressure", "humidity"}, addrs: []uint16{0x76, 0x77}},
	"bmp280":  {points: []string{"temperature", "pressure"}, addrs: []uint16{0x76, 0x77}},
	"mcp9808": {points: []string{"temperature"}, addrs: []uint16{0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x1D, 0x1E, 0x1F}},
	"ads1115": {points: []string{"ain0", "ain1", "ain2", "ain3", "diff01", "diff03", "diff13", "diff23"}, addrs: []uint16{0x48, 0x49, 0x4A, 0x4B}},
}

// ProfileNames lists the I²C device profiles.
func ProfileNames() []string {
	var n []string
	for k := range i2cProfiles {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// profileSpec is a validated profile binding.
type profileSpec struct {
	part  string
	point string
	ads   ads1115.Config
}

func (s *profileSpec) label() string { return s.part + " " + s.point }

// profileBinding validates the profile keys of k into s.
func profileBinding(p *manifest.BindingErrors, s *pointSpec, k *bindingKeys) {
	part := strings.ToLower(strings.TrimSpace(*k.Profile))
	prof, ok := i2cProfiles[part]
	if !ok {
		p.Add("profile", fmt.Sprintf("no I²C device profile %q", *k.Profile), "use one of "+strings.Join(ProfileNames(), ", "))
		return
	}
	ps := &profileSpec{part: part}
	s.profile = ps
	switch {
	case k.Point != nil:
		ps.point = strings.ToLower(strings.TrimSpace(*k.Point))
		if !slices.Contains(prof.points, ps.point) {
			p.Add("point", fmt.Sprintf("profile %s has no point %q", part, *k.Point), "use one of its points: "+strings.Join(prof.points, ", "))
		}
	case len(prof.points) == 1:
		ps.point = prof.points[0]
	default:
		p.Add("profile", fmt.Sprintf("profile %s needs point: to say which of its values this capability is", part), "add point: with one of "+strings.Join(prof.points, ", "))
	}
	if s.addr != 0 && !slices.Contains(prof.addrs, s.addr) {
		var a []string
		for _, x := range prof.addrs {
			a = append(a, fmt.Sprintf("0x%02X", x))
		}
		p.Add("address", fmt.Sprintf("profile %s: the part answers at %s, not at 0x%02X", part, strings.Join(a, ", "), s.addr), "use the address its address pins select (i2cdetect shows it)")
	}
	for _, f := range []struct {
		key string
		set bool
	}{{"register", k.Register != nil}, {"width", k.Width != nil}, {"signed", k.Signed != nil}, {"byte_order", k.ByteOrder != nil},
		{"command", k.Command != nil}, {"command_bytes", k.CommandBytes != nil}, {"wait_ms", k.WaitMS != nil}, {"read_bytes", k.ReadBytes != nil},
		{"crc", k.CRC != nil}, {"field", k.Field != nil}} {
		if f.set {
			p.Add(f.key, fmt.Sprintf("%s does not apply to profile %s: the device driver reads the part", f.key, part), "remove "+f.key+" (or drop profile: and read the registers by hand)")
		}
	}
	if s.writable {
		p.AddCap("kind", fmt.Sprintf("profile %s is a sensor: its points are read-only", part), "make the capability kind: read")
	}
	if s.dataType == manifest.TypeBool {
		p.AddCap("data_type", fmt.Sprintf("profile %s reads a measurement, not a bool", part), "use data_type float (or int)")
	}
	if part == "ads1115" {
		ps.ads = ads1115.Config{Input: ads1115.Inputs[ps.point], FullScale: 2.048, Rate: 128} // the chip's power-on gain and rate
		if k.FullScaleV != nil {
			ps.ads.FullScale = *k.FullScaleV
			if !slices.Contains(ads1115.FullScale, *k.FullScaleV) {
				p.Add("full_scale_v", fmt.Sprintf("full_scale_v %v is not a gain the ADS1115 has", *k.FullScaleV),
					"use one of 6.144, 4.096, 2.048, 1.024, 0.512, 0.256 (volts; the smallest above your signal)")
			}
		}
		if k.DataRateSPS != nil {
			ps.ads.Rate = *k.DataRateSPS
			if !slices.Contains(ads1115.DataRates, *k.DataRateSPS) {
				p.Add("data_rate_sps", fmt.Sprintf("data_rate_sps %d is not a rate the ADS1115 has", *k.DataRateSPS), "use one of 8, 16, 32, 64, 128, 250, 475, 860")
			}
		}
	} else {
		for _, f := range []struct {
			key string
			set bool
		}{{"full_scale_v", k.FullScaleV != nil}, {"data_rate_sps", k.DataRateSPS != nil}} {
			if f.set {
				p.Add(f.key, fmt.Sprintf("%s applies to profile ads1115, not %s", f.key, part), "remove "+f.key)
			}
		}
	}
}

// txBus lends the device drivers the locked bus for one transaction, as
// periph's i2c.Bus.
type txBus struct {
	tx   txFunc
	name string
}

func (b txBus) Tx(addr uint16, w, r []byte) error { return b.tx(addr, w, r) }
func (b txBus) SetSpeed(physic.Frequency) error   { return errors.New("i2c: speed is set by the bus") }
func (b txBus) String() string                    { return b.name }

var _ i2c.Bus = txBus{}

// readProfile runs the part's measurement under the bus lock and returns
// the point's value in its unit (°C, Pa, %RH, V), before scale and offset.
func (p *point) readProfile(ctx context.Context) (float64, error) {
	s := p.spec.profile
	var v float64
	err := p.bus.transact(ctx, func(tx txFunc) error {
		dev := &i2c.Dev{Bus: txBus{tx: tx, name: p.bus.name}, Addr: p.spec.addr}
		switch s.part {
		case "bme280", "bmp280":
			d, err := bme280.New(dev)
			if err != nil {
				return err
			}
			if s.part == "bme280" && !d.HasHumidity() && s.point == "humidity" {
				return fmt.Errorf("the chip at 0x%02X is a BMP280, which has no humidity sensor: %w", p.spec.addr, bme280.ErrWrongChip)
			}
			r, err := d.Sense(ctx)
			if err != nil {
				return err
			}
			switch s.point {
			case "temperature":
				v = r.TemperatureC
			case "pressure":
				v = r.PressurePa
			default:
				v = r.HumidityRH
			}
		case "mcp9808":
			d, err := mcp9808.New(dev)
			if err != nil {
				return err
			}
			v, err = d.Temperature()
			return err
		case "ads1115":
			d, err := ads1115.New(dev)
			if err != nil {
				return err
			}
			v, err = d.Read(ctx, s.ads)
			return err
		}
		return nil
	})
	return v, err
}
