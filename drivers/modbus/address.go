package modbus

import (
	"fmt"
	"strconv"
	"strings"
)

// The address rule (also in the package doc):
//
//   - A plain number (binding address: 17 or 0x11) is the 0-based protocol
//     address, the number that goes on the wire. It needs table:.
//   - The PhysMCP address string "slave=1:reg=40001:type=holding" is a list
//     of key=value pairs joined by ':'. reg= takes Modicon notation only: 5
//     or 6 digits, 1-based, the first digit naming the table (0 coil,
//     1 discrete input, 3 input register, 4 holding register), so
//     reg=40001 is holding address 0 and reg=400001 is the same register
//     in 6-digit form. addr= takes a 0-based protocol address (and then
//     needs type= or table:). slave= (or unit=) is the unit id, type= (or
//     table=) the table.
//   - Anything said twice must agree: reg=40001 with type=coil, or
//     slave=1 with unit: 2, is an error, never a silent choice.

// addrSpec is what an address string says; nil fields were not given.
type addrSpec struct {
	unit    *int
	table   *table
	addr    *uint16
	modicon string // the reg= text, when the address came from it
}

var addrKeys = []string{"slave", "unit", "reg", "addr", "type", "table"}

// parseAddress parses a binding address string (see the rule above).
func parseAddress(s string) (addrSpec, error) {
	var a addrSpec
	s = strings.TrimSpace(s)
	if s == "" {
		return a, nil
	}
	if !strings.Contains(s, "=") {
		n, err := parseNumber(s, 0xFFFF)
		if err != nil {
			return a, fmt.Errorf("%q is neither a 0-based protocol address nor a PhysMCP address string: %v", s, err)
		}
		u := uint16(n)
		a.addr = &u
		return a, nil
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ":") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		k, v = strings.ToLower(strings.TrimSpace(k)), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return a, fmt.Errorf("%q is not key=value (the address string looks like slave=1:reg=40001:type=holding)", part)
		}
		canon := k
		switch k {
		case "unit":
			canon = "slave"
		case "table":
			canon = "type"
		}
		if seen[canon] {
			return a, fmt.Errorf("%s= is given twice", k)
		}
		seen[canon] = true
		switch canon {
		case "slave":
			n, err := parseNumber(v, 255)
			if err != nil {
				return a, fmt.Errorf("%s=%s: %v", k, v, err)
			}
			u := int(n)
			a.unit = &u
		case "reg":
			t, addr, err := parseModicon(v)
			if err != nil {
				return a, fmt.Errorf("reg=%s: %v", v, err)
			}
			if a.addr != nil {
				return a, fmt.Errorf("give either reg= (Modicon, 1-based) or addr= (0-based), not both")
			}
			if a.table != nil && *a.table != t {
				return a, fmt.Errorf("reg=%s is a %s reference but type=%s", v, t, *a.table)
			}
			a.table, a.addr, a.modicon = &t, &addr, v
		case "addr":
			if a.addr != nil {
				return a, fmt.Errorf("give either reg= (Modicon, 1-based) or addr= (0-based), not both")
			}
			n, err := parseNumber(v, 0xFFFF)
			if err != nil {
				return a, fmt.Errorf("addr=%s: %v", v, err)
			}
			u := uint16(n)
			a.addr = &u
		case "type":
			t, ok := tableNames[strings.ToLower(v)]
			if !ok {
				return a, fmt.Errorf("type=%s: unknown table; use coil, discrete, input or holding", v)
			}
			if a.table != nil && *a.table != t {
				return a, fmt.Errorf("type=%s disagrees with reg=%s, which is a %s reference", v, a.modicon, *a.table)
			}
			a.table = &t
		default:
			return a, fmt.Errorf("unknown key %q; the address string takes %s", k, strings.Join(addrKeys, ", "))
		}
	}
	return a, nil
}

// parseModicon decodes 5- or 6-digit Modicon notation (1-based).
func parseModicon(s string) (table, uint16, error) {
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, 0, fmt.Errorf("Modicon references are digits only, e.g. 40001")
		}
	}
	if len(s) != 5 && len(s) != 6 {
		return 0, 0, fmt.Errorf("reg= takes 5- or 6-digit Modicon notation (40001 is the first holding register); " +
			"for a 0-based protocol address write addr=N with type=")
	}
	var t table
	switch s[0] {
	case '0':
		t = tableCoil
	case '1':
		t = tableDiscrete
	case '3':
		t = tableInput
	case '4':
		t = tableHolding
	default:
		return 0, 0, fmt.Errorf("a Modicon reference starts with 0 (coil), 1 (discrete input), 3 (input register) or 4 (holding register)")
	}
	n, _ := strconv.Atoi(s[1:])
	max := 9999
	if len(s) == 6 {
		max = 65536
	}
	if n < 1 || n > max {
		return 0, 0, fmt.Errorf("the register number after the table digit must be 1..%d (Modicon numbers are 1-based: %d%0*d is address 0)",
			max, t.modicon(), len(s)-1, 1)
	}
	return t, uint16(n - 1), nil
}

// parseNumber parses a decimal or 0x-hex number in [0, max]. A leading zero
// does not mean octal: "010" is ten, as an engineer reading a device manual
// would expect.
func parseNumber(s string, max uint64) (uint64, error) {
	base, digits := 10, s
	if strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X") {
		base, digits = 16, s[2:]
	}
	n, err := strconv.ParseUint(digits, base, 64)
	if err != nil {
		return 0, fmt.Errorf("not a number (use decimal, or hex with 0x)")
	}
	if n > max {
		return 0, fmt.Errorf("%d is above the maximum %d", n, max)
	}
	return n, nil
}
