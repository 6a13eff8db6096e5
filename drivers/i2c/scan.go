package i2c

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/physd/physd/drivers/devices/bme280"
	"github.com/physd/physd/drivers/devices/mcp9808"
	"github.com/physd/physd/drivers/scanskel"
	"periph.io/x/conn/v3/i2c"
)

// Scanning (physd scan i2c): sweep the 7-bit addresses 0x03..0x77 with a
// one-byte read each (i2cdetect -r), and recognise the parts physd has
// profiles for by their id registers. Nothing is written to any device
// but a register pointer (the register about to be read).

// Found is one address that answered.
type Found struct {
	Addr    uint16
	Profile string // bme280, bmp280, mcp9808, ads1115; "" when not recognised
	How     string // what recognised it, e.g. "chip id 0x60 at 0xD0"
}

// OpenForScan opens a bus the way the bus: key names it ("1",
// "/dev/i2c-1", an i2creg name) and returns it with its resolved name.
func OpenForScan(arg string) (i2c.BusCloser, string, error) {
	note := initHost()
	ref := findRef(arg)
	if ref == nil {
		return nil, "", notFound("scan", arg, note)
	}
	bc, err := ref.Open()
	if err != nil {
		return nil, "", fmt.Errorf("i2c bus %q (%s) cannot be opened: %v; check that this user may open it (sudo usermod -aG i2c $USER)", arg, ref.Name, err)
	}
	return bc, ref.Name, nil
}

// Sweep probes every address from 0x03 to 0x77 and identifies what answers.
func Sweep(b i2c.Bus) []Found {
	var out []Found
	one := make([]byte, 1)
	for a := uint16(0x03); a <= 0x77; a++ {
		if b.Tx(a, nil, one) != nil {
			continue
		}
		f := Found{Addr: a}
		f.Profile, f.How = identify(&i2c.Dev{Bus: b, Addr: a})
		out = append(out, f)
		time.Sleep(time.Millisecond) // a slow bus gets a breath between probes
	}
	return out
}

// identify reads the id registers of the parts that can live at d.Addr.
func identify(d *i2c.Dev) (string, string) {
	switch {
	case d.Addr == 0x76 || d.Addr == 0x77:
		id := []byte{0}
		if d.Tx([]byte{bme280.RegChipID}, id) == nil {
			switch id[0] {
			case bme280.ChipBME280:
				return "bme280", "chip id 0x60 at 0xD0"
			case bme280.ChipBMP280:
				return "bmp280", "chip id 0x58 at 0xD0"
			}
		}
	case d.Addr >= 0x18 && d.Addr <= 0x1F:
		m, dev := make([]byte, 2), make([]byte, 2)
		if d.Tx([]byte{mcp9808.RegManufacturer}, m) == nil && d.Tx([]byte{mcp9808.RegDevice}, dev) == nil &&
			binary.BigEndian.Uint16(m) == mcp9808.ManufacturerID && dev[0] == mcp9808.DeviceID {
			return "mcp9808", "manufacturer id 0x0054, device id 0x04"
		}
	case d.Addr >= 0x48 && d.Addr <= 0x4B:
		// The ADS1115 has no id register. Idle in single-shot mode with
		// the comparator off (its power-on state, 0x8583, and the state
		// physd leaves it in) is a strong hint, not proof.
		c := make([]byte, 2)
		if d.Tx([]byte{0x01}, c) == nil {
			if v := binary.BigEndian.Uint16(c); v&0x8103 == 0x8103 {
				return "ads1115", fmt.Sprintf("config register 0x%04X: idle, single-shot, comparator off (no id register: check the part)", v)
			}
		}
	}
	return "", ""
}

// I2CSkeleton writes a manifest that `physd validate` accepts: one bus and
// one capability per point of every recognised part, with DECIDE comments;
// unrecognised addresses are listed as comments.
func I2CSkeleton(busArg, resolved, command string, found []Found) []byte {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format+"\n", a...) }
	p("# Manifest skeleton written by physd scan i2c (one-byte reads and id-register reads only).")
	if command != "" {
		p("#   %s", command)
	}
	p("# bus %s (%s): %d address(es) answered.", busArg, resolved, len(found))
	for _, f := range found {
		if f.Profile == "" {
			p("#   0x%02X answers but is not a part physd has a profile for: bind its registers by hand (register:, width:, scale:)", f.Addr)
		}
	}
	scanskel.Opening(&w, "gw_i2c_001", "sensor_gateway", "where the sensors are")
	p("buses:")
	p("  i2c1: {type: i2c, bus: %q}", busArg)
	p("")
	p("capabilities:")
	n := 0
	units := map[string]string{"temperature": "°C", "pressure": "Pa (scale: 0.01 for hPa)", "humidity": "%RH"}
	unitKeys := map[string]string{"temperature": "celsius", "pressure": "pascal   # or hPa with scale: 0.01", "humidity": "percent"}
	for _, f := range found {
		prof, ok := i2cProfiles[f.Profile]
		if !ok {
			continue
		}
		p("")
		p("  # ==== 0x%02X: %s (%s)", f.Addr, strings.ToUpper(f.Profile), f.How)
		extra := ""
		pts := prof.points
		if f.Profile == "ads1115" {
			pts = pts[:4]
			extra = ", full_scale_v: 4.096, data_rate_sps: 128"
			p("  # DECIDE: single-ended inputs ain0..ain3 are listed; use diff01/diff23... for a differential")
			p("  # sensor, and the smallest full_scale_v above the signal (6.144 4.096 2.048 1.024 0.512 0.256 V).")
		}
		for _, pt := range pts {
			n++
			u, uk := units[pt], unitKeys[pt]
			if f.Profile == "ads1115" {
				u = "V (scale:/offset: turn volts into the sensor's unit)"
				uk = "volt   # DECIDE: the sensor's unit once scale:/offset: convert the volts"
			}
			p("  - name: x%02x_%s   # DECIDE: what it measures", f.Addr, pt)
			p("    kind: read")
			p("    description: %q", fmt.Sprintf("%s at 0x%02X, %s, in %s.", strings.ToUpper(f.Profile), f.Addr, pt, u))
			p("    binding: {type: i2c, bus: i2c1, address: 0x%02X, profile: %s, point: %s%s}", f.Addr, f.Profile, pt, extra)
			p("    data_type: float")
			p("    unit: %s", uk)
			p("    semantic_tags: [%s, %s]   # DECIDE", f.Profile, pt)
		}
	}
	if n == 0 {
		p("  # NO KNOWN PART WAS FOUND: check wiring and pull-ups, and that the bus is enabled; bind")
		p("  # the addresses listed above by hand.")
		p("  []")
	}
	return []byte(w.String())
}
