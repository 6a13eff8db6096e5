package ds18b20

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64
	}{
		{"72 01 4b 46 7f ff 0e 10 57 : crc=57 YES\n72 01 4b 46 7f ff 0e 10 57 t=23125\n", 23.125},
		{"5e ff 4b 46 7f ff 02 10 a8 : crc=a8 YES\n5e ff 4b 46 7f ff 02 10 a8 t=-10125\n", -10.125},
		{"d0 07 4b 46 7f ff 0c 10 1c : crc=1c YES\nd0 07 4b 46 7f ff 0c 10 1c t=125000", 125},
		{"00 00 4b 46 7f ff 0c 10 c8 : crc=c8 YES\n00 00 4b 46 7f ff 0c 10 c8 t=0\n", 0},
	} {
		if got, err := Parse([]byte(c.in)); err != nil || got != c.want {
			t.Errorf("%q: %v %v, want %v", c.in, got, err, c.want)
		}
	}
	if _, err := Parse([]byte("72 01 4b 46 7f ff 0e 10 57 : crc=00 NO\n72 01 4b 46 7f ff 0e 10 57 t=23125\n")); !errors.Is(err, ErrCRC) {
		t.Errorf("crc NO: %v", err)
	}
	if _, err := Parse([]byte("50 05 4b 46 7f ff 0c 10 1c : crc=1c YES\n50 05 4b 46 7f ff 0c 10 1c t=85000\n")); !errors.Is(err, ErrPowerOn) {
		t.Errorf("power-on value: %v", err)
	}
	for _, bad := range []string{"", "x : crc=1c YES", "x : crc=1c YES\nno temperature", "x : crc=1c MAYBE\nx t=1", "x : crc=1c YES\nx t=abc"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCheckID(t *testing.T) {
	if p, err := CheckID("28-0316a2794bff"); err != nil || p != "DS18B20" {
		t.Fatalf("%v %v", p, err)
	}
	for bad, want := range map[string]string{
		// An id copied in capitals: the fix is that id in lower case.
		"28-0316A2794BFF": "write it in lower case, 28-0316a2794bff",
		"28_0316a2794bff": "the family, a dash and 12 hex digits",
		"28-0316a2794bf":  "the family, a dash and 12 hex digits",
		"29-0316a2794bff": "family 29",
		"":                "the family, a dash and 12 hex digits",
	} {
		if _, err := CheckID(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", bad, err, want)
		}
	}
}
