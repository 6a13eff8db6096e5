package i2c

import (
	"errors"
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// number is a finite float written as a YAML number or as a fraction such
// as "175/65535". Datasheets give conversions as fractions; making people
// type 0.00267032883 invites transcription errors, and the fraction keeps
// full float64 precision.
type number float64

// UnmarshalYAML implements yaml.Unmarshaler (manifest.DecodeNode calls it
// and positions its errors at the value).
func (x *number) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return errors.New(`expected a number or a fraction such as "175/65535"`)
	}
	v, err := parseNumber(n.Value)
	if err != nil {
		return err
	}
	*x = number(v)
	return nil
}

// parseNumber reads "0.5", "-45", "0x10", "175/65535".
func parseNumber(s string) (float64, error) {
	bad := errors.New("invalid number " + strconv.Quote(s) + `: write a number (0.0625) or a fraction ("175/65535")`)
	num, den, isFrac := strings.Cut(strings.TrimSpace(s), "/")
	a, err := parseFloat(num)
	if err != nil {
		return 0, bad
	}
	v := a
	if isFrac {
		d, err := parseFloat(den)
		if err != nil || d == 0 {
			return 0, bad
		}
		v = a / d
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, errors.New(strconv.Quote(s) + " is not a finite number")
	}
	return v, nil
}

func parseFloat(s string) (float64, error) {
	s = strings.TrimSpace(s)
	if i, err := strconv.ParseInt(s, 0, 64); err == nil {
		return float64(i), nil // 0x10, 0o17, 0b101 as well as 16
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, errors.New("not a finite number")
	}
	return f, nil
}
