package modbus

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/goburrow/serial"
	"github.com/physd/physd/drivers/modbus/modbustest"
	"github.com/physd/physd/manifest"
)

// blockSummary is "holding 0+20" per block, for comparisons.
func blockSummary(u ScannedUnit) []string {
	var out []string
	for _, b := range u.Blocks {
		out = append(out, fmt.Sprintf("%s %d+%d", b.Table, b.Start, b.Len()))
	}
	return out
}

// onlyReads fails the test if the bank saw anything but reads and
// device identification.
func onlyReads(t *testing.T, bank *modbustest.Bank) {
	t.Helper()
	for _, r := range bank.Requests() {
		if r.Write || (r.Function != 1 && r.Function != 2 && r.Function != 3 && r.Function != 4 && r.Function != 43) {
			t.Fatalf("the scan sent %+v; it must only read", r)
		}
	}
}

// TestScanTCP: against a Modbus TCP server, the scan finds the answering
// units (an exception proves a unit is there; the gateway's exception 11
// does not), the exact edges of the readable blocks, including holes in
// the middle of a probe chunk, the values read, a table the unit refuses,
// and it never writes.
func TestScanTCP(t *testing.T) {
	srv, bank := peer(t)
	bank.Size = 100
	for u := byte(0); u < 255; u++ {
		bank.Absent(u, u != 1 && u != 4)
	}
	bank.SetHolding(1, 0, 550, 60, 1)
	bank.SetHolding(1, 23, 0xFFFE)
	bank.SetCoil(1, 0, true, false, true)
	for a := uint16(20); a <= 22; a++ {
		bank.Hole(1, modbustest.HoldingRegisters, a)
	}
	for a := uint16(0); a <= 39; a++ {
		bank.Hole(1, modbustest.InputRegisters, a)
	}
	bank.SetFault(func(r modbustest.Request) error {
		if r.Unit == 1 && r.Table == modbustest.DiscreteInputs {
			return modbustest.IllegalFunction
		}
		if r.Unit == 4 {
			return modbustest.IllegalDataAddress // present, nothing readable
		}
		return nil
	})
	rep, err := Scan(context.Background(), ScanOptions{TCP: srv.Addr, Units: []byte{1, 2, 3, 4, 5}, Timeout: time.Second, From: 0, To: 99, Chunk: 16})
	if err != nil {
		t.Fatal(err)
	}
	onlyReads(t, bank)
	if len(rep.Units) != 2 || rep.Units[0].ID != 1 || rep.Units[1].ID != 4 || rep.Tried != 5 {
		t.Fatalf("units %+v (tried %d), want 1 and 4", rep.Units, rep.Tried)
	}
	u := rep.Units[0]
	want := []string{"holding 0+20", "holding 23+77", "input 40+60", "coil 0+100"}
	if got := blockSummary(u); !reflect.DeepEqual(got, want) {
		t.Fatalf("blocks %v, want %v", got, want)
	}
	if r := u.Blocks[0].Regs; r[0] != 550 || r[1] != 60 || r[2] != 1 || u.Blocks[1].Regs[0] != 0xFFFE {
		t.Fatalf("values %v %v", r, u.Blocks[1].Regs[:1])
	}
	if b := u.Blocks[3].Bits; !b[0] || b[1] || !b[2] {
		t.Fatalf("coils %v", b[:3])
	}
	if len(u.Notes) != 1 || !strings.Contains(u.Notes[0], "no discrete table") {
		t.Fatalf("notes %q, want the refused discrete table", u.Notes)
	}
	if !strings.Contains(u.IdentNote, "illegal function") {
		t.Fatalf("ident note %q: the TCP server has no function 43", u.IdentNote)
	}
	if len(rep.Units[1].Blocks) != 0 {
		t.Fatalf("unit 4 blocks %v, want none", blockSummary(rep.Units[1]))
	}

	// The skeleton validates, names the unit in every capability, binds
	// each readable address raw, and says where a person must decide.
	skel := rep.Skeleton(SkeletonOptions{Bus: "plant"})
	m, err := manifest.Parse("skel.yml", skel)
	if err != nil {
		t.Fatalf("skeleton does not validate: %v\n%s", err, skel)
	}
	if len(m.Capabilities) != 20+77+60+100 {
		t.Fatalf("%d capabilities", len(m.Capabilities))
	}
	s := string(skel)
	for _, part := range []string{
		"# ==== unit 1: no identification", "# ==== unit 4:",
		"- name: u1_holding_23", "read 65534 at scan time", "# hint: as int16 this is -2",
		"binding: {type: modbus, bus: plant, unit: 1, table: holding, address: 0, data_type: uint16}",
		"binding: {type: modbus, bus: plant, unit: 1, table: coil, address: 99}",
		"DECIDE: data_type, scale, byte_order", "no discrete table",
	} {
		if !strings.Contains(s, part) {
			t.Errorf("skeleton lacks %q", part)
		}
	}
	bus, err := Open(context.Background(), m.Buses["plant"])
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	for _, c := range m.Capabilities {
		if c.Name == "u1_holding_0" || c.Name == "u1_coil_2" || c.Name == "u1_input_40" {
			p, err := bus.Point(c)
			if err != nil {
				t.Fatalf("%s: %v", c.Name, err)
			}
			want := map[string]any{"u1_holding_0": int64(550), "u1_coil_2": true, "u1_input_40": int64(0)}[c.Name]
			if got := readOK(t, p); got != want {
				t.Errorf("%s reads %v (%T), want %v", c.Name, got, got, want)
			}
		}
	}
}

// TestScanRTU: over a pty, the slave answers units 2 and 5 only: the
// sweep finds both without being misled by the silent ones, reads unit
// 2's device identification (function 43/14) and finds both units'
// blocks, reading only.
func TestScanRTU(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	bank := modbustest.NewBank(40)
	slave := modbustest.ServeRTU(ptmx, bank, 2, 5)
	t.Cleanup(func() {
		_ = tty.Close()
		<-slave.Done()
		_ = ptmx.Close()
	})
	bank.SetIdent(2, "Eastron", "SDM120", "1.02", "", "Energy meter", "SDM120-Modbus")
	bank.SetInput(2, 0, 0x4366, 0x0000) // 230.0 V, float32
	bank.SetInput(5, 0, 0x4366, 0x0000)
	rep, err := Scan(context.Background(), ScanOptions{
		Serial: serial.Config{Address: tty.Name(), BaudRate: 115200, DataBits: 8, Parity: "N", StopBits: 2},
		Units:  []byte{1, 2, 3, 4, 5, 6}, Timeout: 150 * time.Millisecond, Silence: 20 * time.Millisecond, From: 0, To: 63,
	})
	if err != nil {
		t.Fatal(err)
	}
	onlyReads(t, bank)
	if len(rep.Units) != 2 || rep.Units[0].ID != 2 || rep.Units[1].ID != 5 {
		t.Fatalf("units %+v, notes %q", rep.Units, rep.Notes)
	}
	u := rep.Units[0]
	wantIdent := []IdentObject{{0, "VendorName", "Eastron"}, {1, "ProductCode", "SDM120"}, {2, "MajorMinorRevision", "1.02"},
		{3, "VendorUrl", ""}, {4, "ProductName", "Energy meter"}, {5, "ModelName", "SDM120-Modbus"}}
	if !reflect.DeepEqual(u.Ident, wantIdent) {
		t.Fatalf("ident %+v", u.Ident)
	}
	want := []string{"holding 0+40", "input 0+40", "coil 0+40", "discrete 0+40"}
	for _, u := range rep.Units {
		if got := blockSummary(u); !reflect.DeepEqual(got, want) {
			t.Fatalf("unit %d blocks %v, want %v", u.ID, got, want)
		}
	}
	if !strings.Contains(rep.Units[1].IdentNote, "illegal function") {
		t.Fatalf("unit 5 ident note %q", rep.Units[1].IdentNote)
	}
	skel := string(rep.Skeleton(SkeletonOptions{}))
	m, err := manifest.Parse("skel.yml", []byte(skel))
	if err != nil {
		t.Fatalf("skeleton: %v\n%s", err, skel)
	}
	// The profile's points validate as bindings on the bus (the driver's
	// own check, as physd validate runs it).
	for _, c := range m.Capabilities {
		if _, err := parseBinding(c, TypeRTU); err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
	}
	for _, part := range []string{
		`# ==== unit 2: VendorName "Eastron", ProductCode "SDM120"`, "type: modbus_rtu", "baud: 115200", "parity: N", "stop_bits: 2",
		"# It identifies as Eastron SDM120-Modbus: profile eastron_sdm120 names its registers",
		`description: "Unit 2 (Eastron SDM120 1.02 SDM120-Modbus): Line to neutral voltage (30001) [volt]."`,
		"binding: {type: modbus, bus: modbus1, unit: 2, profile: eastron_sdm120, point: voltage}",
		// unit 5 did not identify itself: raw registers, with hints.
		`description: "Unit 5, input 30001 (address 0), read 17254 at scan time."`,
		"float32 ABCD reads 230: if so, bind data_type: float32",
	} {
		if !strings.Contains(skel, part) {
			t.Errorf("skeleton lacks %q", part)
		}
	}
}

// TestScanMaxTime: units that never answer cost a timeout each; the scan
// stops at MaxTime and lists the units it did not reach.
func TestScanMaxTime(t *testing.T) {
	srv, bank := peer(t)
	bank.SetDelay(func(modbustest.Request) time.Duration { return 300 * time.Millisecond })
	units := make([]byte, 40)
	for i := range units {
		units[i] = byte(i + 1)
	}
	start := time.Now()
	rep, err := Scan(context.Background(), ScanOptions{TCP: srv.Addr, Units: units, Timeout: 50 * time.Millisecond, MaxTime: 400 * time.Millisecond, To: 15})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Units) != 0 || len(rep.Skipped) == 0 || rep.Tried+len(rep.Skipped) != 40 || rep.Tried >= 40 {
		t.Fatalf("tried %d, skipped %v, units %d", rep.Tried, rep.Skipped, len(rep.Units))
	}
	// Generous: the bound is MaxTime plus one request in flight.
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("scan took %v with max 400ms", el)
	}
	if s := string(rep.Skeleton(SkeletonOptions{})); !strings.Contains(s, "NOT SCANNED (time ran out): units "+unitList(rep.Skipped)) {
		t.Fatalf("skeleton does not list the skipped units:\n%s", s[:600])
	}
}

func TestMEIReplyLen(t *testing.T) {
	req := appendCRC([]byte{2, 43, 14, 1, 0})
	full := appendCRC([]byte{2, 43, 14, 1, 1, 0, 0, 2, 0, 3, 'a', 'b', 'c', 1, 1, 'x'})
	for i := range len(full) {
		n, err := rtuReplyLen(req, full[:i])
		if err != nil {
			t.Fatalf("prefix %d: %v", i, err)
		}
		if n != 0 && n != len(full) {
			t.Fatalf("prefix %d: length %d, want %d", i, n, len(full))
		}
	}
	if err := checkReply(req, full); err != nil {
		t.Fatal(err)
	}
	if _, err := rtuReplyLen(req, []byte{2, 43, 13, 1, 1, 0, 0, 0}); err == nil {
		t.Fatal("MEI type 13 accepted")
	}
}
