// Package ds18b20 decodes Maxim DS18B20 (and DS18S20, DS1822, DS1825,
// MAX31850) 1-Wire temperature readings as the Linux kernel's w1-therm
// driver exposes them, the way Raspberry Pi images do with
// dtoverlay=w1-gpio: /sys/bus/w1/devices/<family>-<serial>/w1_slave.
//
// Sources: Linux Documentation/w1/slaves/w1_therm.rst (the w1_slave file:
// the 9 scratchpad bytes with "crc=XX YES|NO", then the same bytes with
// "t=<millidegrees C>"); Maxim DS18B20 datasheet 19-7487, power-on reset
// value of the temperature register +85 °C (0550h), family code 28h.
package ds18b20

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Families are the w1 family codes of the temperature sensors w1-therm
// drives.
var Families = map[string]string{
	"10": "DS18S20", "22": "DS1822", "28": "DS18B20", "3b": "DS1825/MAX31850", "42": "DS28EA00",
}

var idRe = regexp.MustCompile(`^([0-9a-f]{2})-([0-9a-f]{12})$`)

// CheckID validates a w1 device id such as "28-0316a2794bff" and returns
// the part's name.
func CheckID(id string) (string, error) {
	m := idRe.FindStringSubmatch(id)
	if m == nil {
		if low := strings.ToLower(id); idRe.MatchString(low) {
			return "", fmt.Errorf("%q is not a 1-Wire device id as the kernel names it: write it in lower case, %s", id, low)
		}
		return "", fmt.Errorf("%q is not a 1-Wire device id: an id is the family, a dash and 12 hex digits in lower case, e.g. 28-0316a2794bff (ls /sys/bus/w1/devices lists them)", id)
	}
	part, ok := Families[m[1]]
	if !ok {
		return "", fmt.Errorf("family %s of %q is not a temperature sensor w1-therm reads (28 DS18B20, 10 DS18S20, 22 DS1822, 3b DS1825, 42 DS28EA00)", m[1], id)
	}
	return part, nil
}

// ErrCRC: the kernel read the scratchpad with a bad CRC (noise, a long or
// unterminated cable, a weak pull-up).
var ErrCRC = errors.New("scratchpad CRC error")

// ErrPowerOn: the sensor reports its power-on value, 85 °C, with a good
// CRC: the conversion did not run (parasite power too weak, or the
// sensor just reset).
var ErrPowerOn = errors.New("power-on value 85 °C")

// Parse decodes the content of a w1_slave file into °C.
func Parse(data []byte) (float64, error) {
	lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	if len(lines) < 2 {
		return 0, fmt.Errorf("w1_slave has %d line(s), want 2 (scratchpad with crc, then t=)", len(lines))
	}
	crc := bytes.TrimSpace(lines[0])
	switch {
	case bytes.HasSuffix(crc, []byte("YES")):
	case bytes.HasSuffix(crc, []byte("NO")):
		return 0, fmt.Errorf("%w (%s): check the cable and the 4.7 kΩ pull-up", ErrCRC, crc)
	default:
		return 0, fmt.Errorf("w1_slave's first line %q does not end in YES or NO", crc)
	}
	i := bytes.Index(lines[1], []byte("t="))
	if i < 0 {
		return 0, fmt.Errorf("w1_slave's second line %q has no t=", lines[1])
	}
	milli, err := strconv.Atoi(string(bytes.TrimSpace(lines[1][i+2:])))
	if err != nil {
		return 0, fmt.Errorf("w1_slave t=%q is not a number", lines[1][i+2:])
	}
	// The scratchpad's first two bytes hold the raw register: 0x0550 is
	// the power-on value (85 °C), which a real 85 °C reading also gives
	// only at exactly 85.000 °C.
	if milli == 85000 && bytes.HasPrefix(bytes.TrimSpace(lines[1]), []byte("50 05")) {
		return 0, fmt.Errorf("%w: the conversion did not run (parasite power too weak, or the sensor just reset)", ErrPowerOn)
	}
	return float64(milli) / 1000, nil
}
