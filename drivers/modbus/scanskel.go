package modbus

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/physd/physd/drivers/scanskel"
	"github.com/physd/physd/profiles"
)

// SkeletonOptions shape the manifest skeleton written from a scan.
type SkeletonOptions struct {
	DeviceID string    // device.id; default gw_modbus_001
	Bus      string    // the bus name; default modbus1
	Command  string    // the command line, recorded in the header
	At       time.Time // when the scan ran
}

// Skeleton writes a PhysMCP manifest that `physd validate` accepts: one
// bus for the scanned endpoint and one read capability per readable
// address, bound raw (uint16 registers, bool bits), with "# DECIDE:"
// comments where only a person can know the answer (names, kind, scale,
// data type, word order) and hints where the values read suggest one.
func (r *ScanReport) Skeleton(o SkeletonOptions) []byte {
	if o.DeviceID == "" {
		o.DeviceID = "gw_modbus_001"
	}
	if o.Bus == "" {
		o.Bus = "modbus1"
	}
	s := &skeleton{r: r, o: o}
	s.header()
	s.preamble()
	for _, u := range r.Units {
		s.p("")
		s.p("  # ==== unit %d: %s", u.ID, oneLine(identLine(u)))
		for _, note := range u.Notes {
			s.p("  # note: %s", oneLine(note))
		}
		if prof := profileFor(u); prof != nil {
			s.profileUnit(u, prof)
		} else {
			s.rawUnit(u)
		}
	}
	if s.n == 0 {
		s.nothingFound()
	}
	return []byte(s.w.String())
}

// skeleton is a manifest skeleton being written.
type skeleton struct {
	r *ScanReport
	o SkeletonOptions
	w strings.Builder
	n int // capabilities written
}

func (s *skeleton) p(format string, a ...any) { fmt.Fprintf(&s.w, format+"\n", a...) }

// header writes the comments that say how the scan ran and what to decide.
func (s *skeleton) header() {
	r, o := s.r, s.o
	s.p("# Manifest skeleton written by physd scan (read-only: only read requests were sent).")
	if o.Command != "" {
		s.p("#   %s", oneLine(o.Command))
	}
	if !o.At.IsZero() {
		s.p("#   at %s", o.At.UTC().Format(time.RFC3339))
	}
	s.p("# %s %s: %d unit(s) asked, %d answered, %d requests in %.1f s.", r.Kind, r.Endpoint, r.Tried, len(r.Units), r.Requests, r.Elapsed.Seconds())
	if len(r.Skipped) > 0 {
		s.p("# NOT SCANNED (time ran out): units %s. Scan them with --units and a longer --max-time.", unitList(r.Skipped))
	}
	for _, n := range r.Notes {
		s.p("# note: %s", oneLine(n))
	}
	s.p("#")
	s.p("# Every capability below is a raw read of one address, named after it.")
	s.p("# Lines marked DECIDE need a person with the device's register map:")
	s.p("#   - rename each capability for what it measures, delete the ones you do not need;")
	s.p("#   - data_type and scale (e.g. int16 with scale: 0.1 for tenths of a degree);")
	s.p("#   - two registers that form one value: data_type float32/uint32/int32 and")
	s.p("#     byte_order (ABCD, or CDAB for word-swapped), then delete the second register;")
	s.p("#   - kind: do only for a setpoint or coil you mean to write, with range,")
	s.p("#     side_effects and requires_permission; a scan never proposes a write.")
}

// preamble writes the device, the network and the scanned bus.
func (s *skeleton) preamble() {
	r, o, sc := s.r, s.o, s.r.Options
	scanskel.Opening(&s.w, o.DeviceID, "modbus_gateway", "where the devices are")
	s.p("buses:")
	s.p("  %s:", o.Bus)
	if r.Kind == TypeTCP {
		s.p("    type: modbus_tcp")
		s.p("    address: %q", r.Endpoint)
	} else {
		s.p("    type: modbus_rtu")
		s.p("    port: %q   # better: the stable name under /dev/serial/by-id/", r.Endpoint)
		s.p("    baud: %d", sc.Serial.BaudRate)
		s.p("    parity: %s", sc.Serial.Parity)
		s.p("    stop_bits: %d", sc.Serial.StopBits)
		s.p("    silence_ms: %d", max(sc.Silence.Milliseconds(), 1))
	}
	s.p("    timeout_ms: %d   # the scan's per-request timeout; every unit answered within it", max(sc.Timeout.Milliseconds(), 1))
	s.p("")
	s.p("capabilities:")
}

// profileUnit binds the points of the library profile a unit identifies as.
func (s *skeleton) profileUnit(u ScannedUnit, prof *profiles.Modbus) {
	o, who := s.o, unitName(u)
	s.p("  # It identifies as %s %s: profile %s names its registers (profiles/modbus/%s.yml);", prof.Vendor, prof.Model, prof.Name, prof.Name)
	s.p("  # its points are bound below instead of the raw addresses the scan read:")
	for _, b := range u.Blocks {
		s.p("  #   %s: %d readable address(es) from %s", b.Table, b.Len(), b.Ref())
	}
	for _, pn := range prof.PointNames() {
		pt := prof.Points[pn]
		dt := "int"
		if strings.HasPrefix(pt.DataType, "float") || pt.Scale != nil || pt.Offset != nil {
			dt = "float"
		}
		s.n++
		s.p("  - name: u%d_%s   # DECIDE: a name for what it measures here", u.ID, pn)
		s.p("    kind: read   # DECIDE: do only for a point the profile marks writable")
		unit := ""
		if pt.Unit != "" {
			unit = " [" + pt.Unit + "]"
		}
		s.p("    description: %q", fmt.Sprintf("Unit %d%s: %s%s.", u.ID, who, pt.Description, unit))
		s.p("    binding: {type: modbus, bus: %s, unit: %d, profile: %s, point: %s}", o.Bus, u.ID, prof.Name, pn)
		s.p("    data_type: %s", dt)
		s.p("    semantic_tags: [unit%d, %s]   # DECIDE: what it measures", u.ID, prof.Name)
	}
}

// rawUnit binds every readable address of a unit raw, with hints.
func (s *skeleton) rawUnit(u ScannedUnit) {
	o, who := s.o, unitName(u)
	for _, b := range u.Blocks {
		t := tableNames[b.Table]
		s.p("  # --- %s: %d readable address(es) from %s", b.Table, b.Len(), b.Ref())
		for i := range b.Len() {
			addr := b.Start + uint16(i)
			name := fmt.Sprintf("u%d_%s_%d", u.ID, b.Table, addr)
			s.n++
			var read, dt, bdt string
			var hints []string
			if t.isBit() {
				read, dt, bdt = fmt.Sprint(b.Bits[i]), "bool", ""
			} else {
				v := b.Regs[i]
				read, dt, bdt = fmt.Sprint(v), "int", ", data_type: uint16"
				if v >= 0x8000 {
					hints = append(hints, fmt.Sprintf("as int16 this is %d", int16(v)))
				}
				if i+1 < len(b.Regs) {
					hints = append(hints, floatHints(b.Regs[i], b.Regs[i+1])...)
				}
			}
			s.p("  - name: %s   # DECIDE: what it is", name)
			s.p("    kind: read   # DECIDE: do only if it is meant to be written")
			s.p("    description: %q", fmt.Sprintf("Unit %d%s, %s, read %s at scan time.", u.ID, who, ref(t, addr), read))
			for _, h := range hints {
				s.p("    # hint: %s", h)
			}
			s.p("    binding: {type: modbus, bus: %s, unit: %d, table: %s, address: %d%s}   # DECIDE: data_type, scale, byte_order", o.Bus, u.ID, b.Table, addr, bdt)
			s.p("    data_type: %s", dt)
			s.p("    semantic_tags: [unit%d, %s]   # DECIDE: what it measures", u.ID, b.Table)
		}
	}
}

// nothingFound writes why the skeleton has no capability. A manifest needs
// at least one; with nothing readable there is nothing to bind, so the
// skeleton says so and fails validation on purpose with a message
// pointing here.
func (s *skeleton) nothingFound() {
	s.p("  # NOTHING READABLE WAS FOUND: no unit answered, or no address in the probed range")
	s.p("  # was readable. Check wiring, baud and parity, the unit ids (--units) and the")
	s.p("  # address range (--registers), then scan again.")
	s.p("  []")
}

// profileFor returns the library profile that fits a unit's
// identification, or nil.
func profileFor(u ScannedUnit) *profiles.Modbus {
	var vendor, product, model string
	for _, o := range u.Ident {
		switch o.ID {
		case 0:
			vendor = o.Value
		case 1:
			product = o.Value
		case 5:
			model = o.Value
		}
	}
	if vendor == "" {
		return nil
	}
	return profiles.MatchModbus(vendor, product, model)
}

// unitName is ", VendorName ProductCode" for a unit that identified itself.
func unitName(u ScannedUnit) string {
	var parts []string
	for _, o := range u.Ident {
		if o.ID <= 2 || o.ID == 5 {
			parts = append(parts, o.Value)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, " ") + ")"
}

// floatHints shows two registers read as a 32-bit float in both word
// orders when the result looks like a measurement.
func floatHints(hi, lo uint16) []string {
	var out []string
	for _, c := range []struct {
		order  string
		a, b   uint16
		prefer string
	}{{"ABCD", hi, lo, ""}, {"CDAB", lo, hi, ", byte_order: CDAB"}} {
		f := math.Float32frombits(uint32(c.a)<<16 | uint32(c.b))
		x := math.Abs(float64(f))
		if f == f && !math.IsInf(float64(f), 0) && x >= 1e-3 && x <= 1e7 {
			out = append(out, fmt.Sprintf("with the next register, float32 %s reads %.6g: if so, bind data_type: float32%s and delete the next one", c.order, f, c.prefer))
		}
	}
	return out
}

var oneLine = scanskel.OneLine

func unitList(ids []byte) string {
	var parts []string
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ids[i], ids[j]))
		} else {
			parts = append(parts, fmt.Sprint(ids[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
