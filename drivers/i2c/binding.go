package i2c

import (
	"fmt"
	"math/bits"
	"strings"
	"time"

	"github.com/physd/physd/manifest"
)

// bindingKeys are the structured keys of an i2c binding (and the key=value
// parts of its address string). Pointers tell "absent" from a zero value.
type bindingKeys struct {
	Register     *uint8   `yaml:"register"`
	Width        *int     `yaml:"width"`
	Signed       *bool    `yaml:"signed"`
	ByteOrder    *string  `yaml:"byte_order"`
	Scale        *number  `yaml:"scale"`
	Offset       *number  `yaml:"offset"`
	Command      *uint32  `yaml:"command"`
	CommandBytes *int     `yaml:"command_bytes"`
	WaitMS       *int     `yaml:"wait_ms"`
	ReadBytes    *int     `yaml:"read_bytes"`
	CRC          *string  `yaml:"crc"`
	Field        *int     `yaml:"field"`
	Profile      *string  `yaml:"profile"`       // a device profile (profile.go)
	Point        *string  `yaml:"point"`         // the profile's value
	FullScaleV   *float64 `yaml:"full_scale_v"`  // ads1115 gain
	DataRateSPS  *int     `yaml:"data_rate_sps"` // ads1115 data rate
}

// Limits on command-style frames: generous for real sensors, small enough
// that a typo cannot make the daemon stall the bus for long.
const (
	maxWaitMS    = 10_000
	maxReadBytes = 64
)

// pointSpec is a validated binding: everything a point needs, no bus.
type pointSpec struct {
	addr     uint16
	format   Format // register width/order, or the 16-bit word of a frame
	dataType string
	writable bool
	tol      float64

	// Register mode.
	isReg bool
	reg   uint8

	// Profile mode: a device driver reads the part (profile.go).
	profile *profileSpec

	// Command mode.
	command   []byte
	wait      time.Duration
	readBytes int
	crc       bool
	field     int
}

// label names the point in errors: "0x48 reg 0x00", "0x44 cmd 0x2400".
func (s *pointSpec) label() string {
	if s.profile != nil {
		return fmt.Sprintf("0x%02X %s", s.addr, s.profile.label())
	}
	if s.isReg {
		return fmt.Sprintf("0x%02X reg 0x%02X", s.addr, s.reg)
	}
	return fmt.Sprintf("0x%02X cmd 0x%X", s.addr, s.command)
}

// parseBinding validates a capability's i2c binding without touching any
// bus, so it serves both Bus.Point and CheckBinding.
func parseBinding(c *manifest.Capability) (*pointSpec, error) {
	p := manifest.NewBindingErrors(c)
	if c.Binding.Type != "i2c" {
		p.Add("type", fmt.Sprintf("binding type %q on an i2c bus", c.Binding.Type), "use type: i2c, or bind the capability to a bus of type "+c.Binding.Type)
	}
	device, addrKeys, err := splitAddress(c.Binding.Address, c.Binding.Pos.Line, c.Binding.Pos.Col)
	if err != nil {
		p.Add("address", err.Error(), `write address: 0x48, or a PhysMCP address such as "0x48:reg=0x00"`)
		return nil, p.Errs
	}
	var k bindingKeys
	if errs := p.DecodeBinding(addrKeys, &k); len(errs) > 0 {
		return nil, errs
	}

	s := &pointSpec{dataType: c.DataType, writable: c.Kind == manifest.KindDo, tol: c.Tolerance}
	switch {
	case device == "":
		p.Add("address", "required: the device's 7-bit I²C address", "add address: 0x48 (i2cdetect -y 1 lists the devices on bus 1)")
	default:
		if s.addr, err = parseDeviceAddress(device); err != nil {
			p.Add("address", err.Error(), "use the address i2cdetect shows, e.g. 0x48")
		}
	}
	s.format = Format{Width: 16, Scale: 1}
	if k.Signed != nil {
		s.format.Signed = *k.Signed
	}
	if k.Scale != nil {
		if *k.Scale == 0 {
			p.Add("scale", "scale must not be 0", "use the sensor's resolution, e.g. scale: 0.0625")
		}
		s.format.Scale = float64(*k.Scale)
	}
	if k.Offset != nil {
		s.format.Offset = float64(*k.Offset)
	}
	switch c.DataType {
	case manifest.TypeFloat, manifest.TypeInt:
	case manifest.TypeBool:
		if k.Scale != nil || k.Offset != nil {
			p.Add("scale", "data_type bool reads raw != 0; scale and offset do not apply", "remove scale and offset, or use data_type float or int")
		}
	default:
		p.AddCap("data_type", fmt.Sprintf("data_type %q is not supported by the i2c driver", c.DataType), "use data_type float, int or bool")
	}

	switch {
	case k.Profile != nil:
		profileBinding(p, s, &k)
	case k.Point != nil || k.FullScaleV != nil || k.DataRateSPS != nil:
		p.Add("point", "point, full_scale_v and data_rate_sps belong to a device profile, but the binding has no profile:",
			"add profile: with one of "+strings.Join(ProfileNames(), ", ")+", or remove them")
	case k.Register != nil && k.Command != nil:
		p.Add("command", "a binding has either register (a register-mapped device) or command (a command-style sensor), not both", "remove one of them")
	case k.Register != nil:
		registerSpec(p, s, &k)
	case k.Command != nil:
		commandSpec(p, s, &k)
	default:
		p.Add("", "an i2c binding needs register, command or profile",
			`add register: 0x00 (or address: "0x48:reg=0x00") for a register-mapped device, command: 0x2400 with read_bytes for a command-style sensor, or profile: (`+strings.Join(ProfileNames(), ", ")+`) for a part physd knows`)
	}
	if len(p.Errs) > 0 {
		return nil, p.Errs
	}
	return s, nil
}

func registerSpec(p *manifest.BindingErrors, s *pointSpec, k *bindingKeys) {
	s.isReg, s.reg = true, *k.Register
	for _, f := range []struct {
		key string
		set bool
	}{
		{"command_bytes", k.CommandBytes != nil}, {"wait_ms", k.WaitMS != nil},
		{"read_bytes", k.ReadBytes != nil}, {"crc", k.CRC != nil}, {"field", k.Field != nil},
	} {
		if f.set {
			p.Add(f.key, f.key+" applies to command-style reads (command:), not to registers", "remove "+f.key+", or use command: instead of register:")
		}
	}
	s.format.Width = 8
	if k.Width != nil {
		s.format.Width = *k.Width
		if !validWidth(*k.Width) {
			p.Add("width", fmt.Sprintf("width %d is not supported", *k.Width), "use width: 8, 16, 24 or 32 (bits)")
		}
	}
	if k.ByteOrder != nil {
		switch *k.ByteOrder {
		case "big":
		case "little":
			s.format.Little = true
		default:
			p.Add("byte_order", fmt.Sprintf("byte_order %q", *k.ByteOrder), "use byte_order: big (most I²C devices) or little")
		}
	}
}

func commandSpec(p *manifest.BindingErrors, s *pointSpec, k *bindingKeys) {
	if s.writable {
		p.Add("command", "command-style points are read-only, but this is a do capability", "bind do capabilities to a register (register:), or make this kind: read")
	}
	for _, f := range []struct {
		key string
		set bool
	}{{"width", k.Width != nil}, {"byte_order", k.ByteOrder != nil}} {
		if f.set {
			p.Add(f.key, "command frames are 16-bit big-endian words; "+f.key+" does not apply", "remove "+f.key+"; choose the word with field:")
		}
	}
	n := max(1, (bits.Len32(*k.Command)+7)/8)
	if k.CommandBytes != nil {
		if *k.CommandBytes < n || *k.CommandBytes > 4 {
			p.Add("command_bytes", fmt.Sprintf("command 0x%X needs %d..4 bytes, got %d", *k.Command, n, *k.CommandBytes), fmt.Sprintf("use command_bytes: %d..4, or drop it", n))
		}
		n = min(max(*k.CommandBytes, n), 4)
	}
	for i := n - 1; i >= 0; i-- {
		s.command = append(s.command, byte(*k.Command>>(8*i)))
	}
	if k.WaitMS != nil {
		if *k.WaitMS < 0 || *k.WaitMS > maxWaitMS {
			p.Add("wait_ms", fmt.Sprintf("wait_ms %d is outside 0..%d", *k.WaitMS, maxWaitMS), "use the measurement time from the datasheet, e.g. wait_ms: 15 for an SHT3x")
		}
		s.wait = time.Duration(*k.WaitMS) * time.Millisecond
	}
	if k.CRC != nil {
		switch *k.CRC {
		case "sht3x":
			s.crc = true
		case "none":
		default:
			p.Add("crc", fmt.Sprintf("crc %q", *k.CRC), "use crc: sht3x (Sensirion CRC-8 after each word) or crc: none")
		}
	}
	stride := wordStride(s.crc)
	switch {
	case k.ReadBytes == nil:
		p.Add("read_bytes", "required for a command-style read", fmt.Sprintf("add read_bytes: the frame length (%d bytes per word), e.g. 6 for an SHT3x", stride))
	case *k.ReadBytes < stride || *k.ReadBytes > maxReadBytes || *k.ReadBytes%stride != 0:
		p.Add("read_bytes", fmt.Sprintf("read_bytes %d is not a whole number of %d-byte words (at most %d bytes)", *k.ReadBytes, stride, maxReadBytes),
			fmt.Sprintf("use a multiple of %d", stride))
	default:
		s.readBytes = *k.ReadBytes
	}
	if k.Field != nil {
		s.field = *k.Field
		if words := s.readBytes / stride; s.readBytes > 0 && (s.field < 0 || s.field >= words) {
			p.Add("field", fmt.Sprintf("field %d is outside the frame's %d words", s.field, words), fmt.Sprintf("use field: 0..%d", words-1))
		}
	}
	// The node cancels a read at timeout_ms; a wait longer than that
	// could never succeed.
	if to := p.Capability().TimeoutMS; to > 0 && s.wait >= time.Duration(to)*time.Millisecond {
		p.AddCap("timeout_ms", fmt.Sprintf("timeout_ms %d leaves no time to read after wait_ms %d", to, s.wait.Milliseconds()), "raise timeout_ms above wait_ms")
	}
}

// CheckBinding validates a capability's i2c binding keys without opening a
// bus, for `physd validate`, which must not touch hardware. Errors are
// manifest.Errors positioned at the key at fault.
func CheckBinding(c *manifest.Capability) error {
	_, err := parseBinding(c)
	return err
}
