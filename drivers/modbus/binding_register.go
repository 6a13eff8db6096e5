package modbus

import (
	"fmt"
	"strings"
)

// Where a binding's point is: its unit, table and register address, each
// said once (a key or the address string) or twice in agreement.

// unit sets the unit (slave) id: unit:, or slave= in the address, or 1 on
// TCP, where most devices ignore it.
func (b *binder) unit() {
	unitMin, unitMax := 0, 255
	if b.busKind == TypeRTU {
		unitMin, unitMax = 1, 247 // 0 is broadcast (no reply); 248..255 are reserved
	}
	a, k := b.a, b.k
	unit := -1
	switch {
	case a.unit != nil && k.Unit != nil && *a.unit != *k.Unit:
		b.p.Add(fmt.Sprintf("unit: %d disagrees with slave=%d in the address", *k.Unit, *a.unit), "keep one of them, or make them the same", "unit")
	case k.Unit != nil:
		unit = *k.Unit
	case a.unit != nil:
		unit = *a.unit
	case b.busKind == TypeTCP:
		unit = 1 // most TCP devices ignore it; gateways route by it
	default:
		b.p.Add("a modbus_rtu binding needs its unit (slave) id", "add unit: N (1..247), or slave=N in the address string")
	}
	if unit >= 0 {
		if unit < unitMin || unit > unitMax {
			b.p.Add(fmt.Sprintf("unit %d is outside %d..%d for %s", unit, unitMin, unitMax, b.busKind), fmt.Sprintf("use a unit id in %d..%d", unitMin, unitMax), "unit")
		}
		b.s.unit = byte(unit)
	}
}

// table sets the table from table: or the address string (0 when neither
// says, after reporting it).
func (b *binder) table() {
	a, k := b.a, b.k
	if k.Table == nil {
		if a.table != nil {
			b.s.table = *a.table
		} else {
			b.p.Add("the binding does not say which table", "add table: coil|discrete|input|holding, or use reg=4xxxx Modicon notation in the address")
		}
		return
	}
	t, ok := tableNames[strings.ToLower(strings.TrimSpace(*k.Table))]
	switch {
	case !ok:
		b.p.Add(fmt.Sprintf("unknown table %q", *k.Table), "use coil, discrete, input or holding", "table")
	case a.table != nil && *a.table != t:
		b.p.Add(fmt.Sprintf("table: %s disagrees with the address, which names a %s", t, *a.table), "keep one of them, or make them the same", "table")
	default:
		b.s.table = t
	}
}

// register sets the register (or bit) address.
func (b *binder) register() {
	if b.a.addr == nil {
		b.addrErr("the binding has no register address", `add address: N (0-based protocol address) or address: "slave=1:reg=40001"`)
		return
	}
	b.s.addr = *b.a.addr
}

// span checks that the point's registers fit the 16-bit address space.
func (b *binder) span() {
	if int(b.s.addr)+int(b.s.qty())-1 > 0xFFFF {
		b.addrErr(fmt.Sprintf("%s at address %d runs past the last address 65535", b.s.codec.dt, b.s.addr), "use a lower address")
	}
}
