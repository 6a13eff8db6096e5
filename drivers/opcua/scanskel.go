package opcua

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/physd/physd/drivers/scanskel"
	"github.com/physd/physd/manifest"
)

// SkeletonOptions shape the manifest skeleton written from a scan.
type SkeletonOptions struct {
	DeviceID string    // device.id; default gw_opcua_001
	Command  string    // the command line, recorded in the header
	At       time.Time // when the scan ran
	// Dir is the folder the skeleton is written to: the bus entry's file
	// names are written relative to it, as a manifest's are read.
	Dir string
}

// MaxArrayElements is the largest array the skeleton binds element by
// element (one capability per element, with index:). Larger arrays, and
// arrays whose length the server does not fix (ArrayDimensions 0 or
// absent), are listed as comments: a hundred capabilities for one node
// help nobody, and an index past a shorter array fails at each read.
const MaxArrayElements = 16

// Skeleton writes a PhysMCP manifest that `physd validate` accepts: one
// opcua bus with the endpoint and the security the scan connected with,
// and one read capability per readable variable of a type physd binds
// (one per element of a small fixed array), with its EURange as range and
// its EngineeringUnits as unit. "# DECIDE:" comments mark what only a
// person can decide (names, which writable nodes become do_ capabilities,
// tags, polling); the variables that cannot be bound are comments that
// say why. It returns the skeleton and how many capabilities it holds.
func (r *ScanReport) Skeleton(o SkeletonOptions) ([]byte, int) {
	if o.DeviceID == "" {
		o.DeviceID = "gw_opcua_001"
	}
	s := &skeleton{r: r, o: o, names: map[string]bool{}}
	s.header()
	s.preamble()
	folder := "\x00"
	for _, v := range r.Variables {
		if f := parentPath(v, r.RootPath); f != folder {
			folder = f
			s.p("")
			s.p("  # ==== %s", oneLine(f))
		}
		s.variable(v)
	}
	if len(r.Methods) > 0 {
		s.p("")
		s.p("  # ==== methods (physd reads and writes variables; it does not call methods):")
		for _, m := range r.Methods {
			s.p("  #   %s (%s)", oneLine(m.PathString()), oneLine(m.NodeID))
		}
	}
	if s.n == 0 {
		s.p("  # NOTHING WAS BOUND: no variable under the root could be read as a number, boolean or")
		s.p("  # string by this identity (the variables found are listed above with the reason).")
		s.p("  # Browse elsewhere with --root, deeper with --depth, or scan as another user.")
		s.p("  []")
	}
	return []byte(s.w.String()), s.n
}

// skeleton is a manifest skeleton being written.
type skeleton struct {
	r     *ScanReport
	o     SkeletonOptions
	w     strings.Builder
	n     int // capabilities written
	names map[string]bool
}

func (s *skeleton) p(format string, a ...any) { fmt.Fprintf(&s.w, format+"\n", a...) }

// header writes the comments that say how the scan ran and what to decide.
func (s *skeleton) header() {
	r, o := s.r, s.o
	op := r.Options
	s.p("# Manifest skeleton written by physd scan opcua (read-only: only Browse and Read requests were sent).")
	if o.Command != "" {
		s.p("#   %s", oneLine(o.Command))
	}
	if !o.At.IsZero() {
		s.p("#   at %s", o.At.UTC().Format(time.RFC3339))
	}
	s.p("# %s (%s/%s, %s): browsed from %s (%s), %d levels deep, at most %d nodes, within %v.",
		oneLine(r.Bus.Endpoint), policyOr(r.Bus.SecurityPolicy), modeOr(r.Bus), oneLine(r.Identity), oneLine(r.RootPath), oneLine(r.Root), op.Depth, op.MaxNodes, op.Timeout)
	s.p("# %d node(s) in %d requests (%.1f s): %d variable(s), %d method(s).", r.Nodes, r.Requests, r.Elapsed.Seconds(), len(r.Variables), len(r.Methods))
	if ol := r.OperationLimits; ol.MaxNodesPerBrowse > 0 || ol.MaxNodesPerRead > 0 {
		s.p("# The server's operation limits (MaxNodesPerBrowse %s, MaxNodesPerRead %s) bounded each request.", limitText(ol.MaxNodesPerBrowse), limitText(ol.MaxNodesPerRead))
	}
	for _, l := range r.Limits {
		s.p("# LIMIT: %s", oneLine(l))
	}
	if len(r.NotBrowsed) > 0 {
		var names []string
		for _, n := range r.NotBrowsed {
			names = append(names, n.PathString()+" ("+n.NodeID+")")
		}
		s.p("# Not browsed: the standard nodes of namespace 0 under Objects (the server's own diagnostics): %s;", oneLine(strings.Join(names, ", ")))
		s.p("#   --root with a node id browses one.")
	}
	for _, n := range r.Notes {
		s.p("# note: %s", oneLine(n))
	}
	s.p("#")
	s.p("# Every capability below reads one variable, named after its browse path; node ids name their")
	s.p("# namespace by URI (nsu=), so a server that reorders its namespaces keeps them right.")
	s.p("# Lines marked DECIDE need a person who knows the plant:")
	s.p("#   - rename each capability for what it is, and delete the ones you do not need;")
	s.p("#   - kind: do only for a node an agent should set: the scan marks the nodes this identity")
	s.p("#     may write as do_ candidates; a do_ needs range, side_effects and requires_permission.")
	s.p("#     A scan never proposes a write;")
	s.p("#   - unit where the server gave none physd names; semantic_tags;")
	s.p("#   - poll_ms and deadband to stream a value's changes (alarms, history, MQTT).")
}

func limitText(n int) string {
	if n == 0 {
		return "none"
	}
	return strconv.Itoa(n)
}

func policyOr(p string) string {
	if p == "" {
		return PolicyNone
	}
	return p
}

func modeOr(b ScanBus) string {
	switch {
	case b.SecurityMode != "":
		return b.SecurityMode
	case policyOr(b.SecurityPolicy) != PolicyNone:
		return ModeSignAndEncrypt
	}
	return ModeNone
}

// preamble writes the device, the network and the scanned bus.
func (s *skeleton) preamble() {
	r, o := s.r, s.o
	scanskel.Opening(&s.w, o.DeviceID, "opcua_gateway", "where the equipment is")
	s.p("buses:")
	s.p("  %s:", r.BusName)
	s.p("    type: opcua")
	for _, e := range r.Bus.entries() {
		switch {
		case e.list != nil:
			var items []string
			for _, f := range e.list {
				items = append(items, strconv.Quote(s.rel(f)))
			}
			s.p("    %s: [%s]", e.key, strings.Join(items, ", "))
		case e.number:
			s.p("    %s: %s", e.key, e.value)
		case e.key == "server_certificate" && r.ServerSHA256 != "":
			s.p("    %s: %s   # pinned: sha256 %s", e.key, strconv.Quote(s.rel(e.value)), r.ServerSHA256)
		case e.path:
			s.p("    %s: %s", e.key, strconv.Quote(s.rel(e.value)))
		default:
			s.p("    %s: %s", e.key, strconv.Quote(e.value))
		}
	}
	if policyOr(r.Bus.SecurityPolicy) != PolicyNone && r.Bus.Certificate == "" {
		s.p("    # DECIDE: certificate: and private_key: physd's application certificate. Left out, physd generates")
		s.p("    # one at each start, and a server that keeps a trust list must trust it anew each time.")
	}
	if r.Bus.Username != "" {
		s.p("    # physd run reads the password from %s in its environment (the unit's Environment= or", r.Bus.PasswordEnv)
		s.p("    # EnvironmentFile=), as the scan did.")
	}
	s.p("")
	s.p("capabilities:")
}

// rel writes a file name relative to the skeleton's folder when it is
// below it or beside it, else absolute.
func (s *skeleton) rel(f string) string {
	abs, err := filepath.Abs(f)
	if err != nil {
		return f
	}
	dir, err := filepath.Abs(s.o.Dir)
	if err != nil {
		return abs
	}
	if rel, err := filepath.Rel(dir, abs); err == nil && !strings.HasPrefix(rel, "../..") {
		return filepath.ToSlash(rel)
	}
	return abs
}

// parentPath is the folder a variable is listed under.
func parentPath(v *ScannedVariable, root string) string {
	if len(v.Path) <= 1 {
		return root
	}
	return strings.Join(v.Path[:len(v.Path)-1], "/")
}

// bindPlan is how a variable is bound, or why it is not.
type bindPlan struct {
	typ      uaType
	elements []int    // nil: the scalar; else one capability per element index
	skip     string   // why it is not bound
	notes    []string // what to know about the binding
}

// plan decides how a variable is bound.
func plan(v *ScannedVariable) bindPlan {
	switch {
	case strings.HasPrefix(v.NodeNote, "cannot"):
		return bindPlan{skip: "its node id " + v.NodeNote}
	case v.Unread != "":
		return bindPlan{skip: v.Unread}
	case v.AccessLevel&0x01 == 0:
		return bindPlan{skip: fmt.Sprintf("not readable (AccessLevel %s)", accessText(v.AccessLevel))}
	case !v.Readable():
		return bindPlan{skip: fmt.Sprintf("this identity may not read it (UserAccessLevel %s; AccessLevel %s): scan as a user who may, if it is needed", accessText(v.UserAccessLevel), accessText(v.AccessLevel))}
	}
	var p bindPlan
	if v.AccessNote != "" {
		p.notes = append(p.notes, v.AccessNote)
	}
	t, ok := lookupType(v.DataType)
	vt, byValue := lookupType(v.ValueType)
	byValue = byValue && (v.TypeClass == "abstract" || v.TypeClass == "unknown") && !isSlice(v.Value)
	switch {
	case v.TypeClass == "builtin" && ok && valueTypeDiffers(v, t):
		// The server declares one type and sends another (a server's
		// bug, but its reads return what it sends): bound by what it
		// sent, which every read checks.
		p.typ = vt
		p.notes = append(p.notes, fmt.Sprintf("the server declares DataType %s but sent %s at scan time: bound as %s, what its reads return", typeLabel(v), article(vt.name), vt.name))
	case v.TypeClass == "builtin" && ok:
		p.typ = t
	case byValue:
		// A DataType that names no one type (BaseDataType, Number), or
		// one that could not be resolved: bound by the type the value
		// had, which every read checks (another type is an error).
		p.typ = vt
		why := "is abstract"
		if v.TypeClass == "unknown" {
			why = "was not resolved to a built-in type"
		}
		p.notes = append(p.notes, fmt.Sprintf("DataType %s %s: bound by the type its value had at scan time (%s); a read of another type is an error", typeLabel(v), why, vt.name))
	default:
		return bindPlan{skip: typeSkip(v)}
	}
	if p.typ.id == ua.TypeIDUint64 {
		p.notes = append(p.notes, "UInt64: a value above 9223372036854775807 reads as an error (capabilities hold 64-bit signed integers)")
	}
	dims := "no ArrayDimensions"
	if len(v.ArrayDims) > 0 {
		dims = fmt.Sprintf("ArrayDimensions %v", v.ArrayDims)
	}
	seen := "no value at scan time"
	if v.Value != nil {
		seen = "a scalar at scan time"
		if isSlice(v.Value) {
			seen = fmt.Sprintf("%d elements at scan time", len(elements(v.Value)))
		}
	}
	switch r := v.ValueRank; {
	case r == -1:
	case (r == -2 || r == -3) && v.Value != nil && !isSlice(v.Value):
		p.notes = append(p.notes, fmt.Sprintf("ValueRank %d (%s): it held a scalar at scan time, but the server may send an array, which reads as an error", r, valueRankName(r)))
	case r == 1 && len(v.ArrayDims) == 1 && v.ArrayDims[0] >= 1 && v.ArrayDims[0] <= MaxArrayElements:
		for i := range int(v.ArrayDims[0]) {
			p.elements = append(p.elements, i)
		}
	case r == 1 || r == -2 || r == -3:
		return bindPlan{skip: fmt.Sprintf("an array (ValueRank %d, %s; %s): the skeleton binds one-dimensional arrays of 1 to %d elements whose length the server fixes, one capability per element; bind the elements you need by hand, each with index: N (from 0)",
			r, dims, seen, MaxArrayElements)}
	default:
		return bindPlan{skip: fmt.Sprintf("ValueRank %d (%s, %s): physd binds scalars and elements of one-dimensional arrays", r, valueRankName(r), dims)}
	}
	return p
}

// article puts "a" or "an" before a type name.
func article(name string) string {
	if name != "" && strings.ContainsRune("AEIOU", rune(name[0])) {
		return "an " + name
	}
	return "a " + name
}

// valueTypeDiffers says whether the value at scan time is of another bindable
// type than the declared one, t.
func valueTypeDiffers(v *ScannedVariable, t uaType) bool {
	vt, ok := lookupType(v.ValueType)
	return ok && v.Value != nil && vt.id != t.id
}

func valueRankName(r int32) string {
	switch r {
	case -3:
		return "scalar or one dimension"
	case -2:
		return "any"
	case 0:
		return "one or more dimensions"
	}
	return fmt.Sprintf("%d dimensions", r)
}

// typeLabel names a variable's DataType: its own name, and the
// built-in type it derives from when that is another.
func typeLabel(v *ScannedVariable) string {
	name := v.DataType
	if v.TypeName != "" {
		name = v.TypeName
		if v.DataType != "" && v.DataType != v.TypeName {
			name += ", a subtype of " + v.DataType + ","
		}
	}
	if name == "" {
		name = "(none given)"
	}
	return name
}

// typeSkip says why a variable's DataType is not bound.
func typeSkip(v *ScannedVariable) string {
	name := typeLabel(v)
	switch v.TypeClass {
	case "enumeration":
		return fmt.Sprintf("DataType %s is an enumeration: its value is an Int32 on the wire; if the numbers will do, bind it by hand with ua_type: Int32 and data_type: int", name)
	case "structure":
		return fmt.Sprintf("DataType %s is a structure: physd binds built-in values; bind its fields where the server shows them as variables (a larger --depth)", name)
	case "abstract":
		held := ""
		if v.ValueType != "" {
			held = fmt.Sprintf("; it held %s at scan time: bind it by hand with ua_type: %s if it always does", article(v.ValueType), v.ValueType)
		}
		return fmt.Sprintf("DataType %s is abstract: the server may send any type under it%s", name, held)
	case "unknown":
		return fmt.Sprintf("DataType %s could not be resolved to a built-in type (HasSubtype)", name)
	}
	return fmt.Sprintf("DataType %s: physd binds Boolean, integer, Float, Double and String nodes", name)
}

// accessText names the access level bits (Part 3 §8.57).
func accessText(b byte) string {
	var out []string
	for _, f := range []struct {
		bit  byte
		name string
	}{{0x01, "CurrentRead"}, {0x02, "CurrentWrite"}, {0x04, "HistoryRead"}, {0x08, "HistoryWrite"}} {
		if b&f.bit != 0 {
			out = append(out, f.name)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "|")
}

// variable writes a variable's capabilities, or why it has none.
func (s *skeleton) variable(v *ScannedVariable) {
	pl := plan(v)
	if pl.skip != "" {
		s.p("  # not bound: %s (%s): %s", oneLine(v.PathString()), oneLine(v.NodeID), oneLine(pl.skip))
		return
	}
	base := s.baseName(v)
	if pl.elements == nil {
		s.capability(v, pl, s.unique(base), -1)
		return
	}
	s.p("  # %s (%s) is an array of %d %s elements: one capability per element (index from 0).", oneLine(v.PathString()), oneLine(v.NodeID), len(pl.elements), v.DataType)
	for _, i := range pl.elements {
		s.capability(v, pl, s.unique(fmt.Sprintf("%s_%d", base, i)), i)
	}
}

// capability writes one capability (index -1: the scalar).
func (s *skeleton) capability(v *ScannedVariable, pl bindPlan, name string, index int) {
	s.n++
	t := pl.typ
	dt := t.class
	numeric := dt == manifest.TypeFloat || dt == manifest.TypeInt
	s.p("  - name: %s   # DECIDE: a name for what it is", name)
	switch {
	case v.Writable() && dt == manifest.TypeString:
		s.p("    kind: read   # DECIDE: do_ candidate (this identity may write it): kind: do needs data_type: enum with enum_values, side_effects and requires_permission")
	case v.Writable():
		s.p("    kind: read   # DECIDE: do_ candidate (this identity may write it): kind: do only if an agent should set it, with side_effects and requires_permission")
	case v.AccessLevel&0x02 != 0:
		s.p("    kind: read   # the node is writable (AccessLevel CurrentWrite), but not by this identity")
	default:
		s.p("    kind: read   # read-only (AccessLevel %s)", accessText(v.AccessLevel))
	}
	s.p("    description: %s", strconv.Quote(description(v, index)))
	binding := fmt.Sprintf("{type: opcua, bus: %s, node: %s, ua_type: %s", s.r.BusName, strconv.Quote(v.NodeID), t.name)
	if index >= 0 {
		binding += fmt.Sprintf(", index: %d", index)
	}
	s.p("    binding: %s}", binding)
	if v.NodeNote != "" {
		s.p("    # node id: %s", oneLine(v.NodeNote))
	}
	for _, n := range pl.notes {
		s.p("    # note: %s", oneLine(n))
	}
	s.p("    data_type: %s", dt)
	if numeric {
		s.unit(v)
		s.valueRange(v, dt)
		if len(v.EnumStrings) > 0 {
			var vals []string
			for i, e := range v.EnumStrings {
				vals = append(vals, fmt.Sprintf("%d %s", i, e))
			}
			s.p("    # values (EnumStrings): %s", oneLine(strings.Join(vals, ", ")))
		}
	}
	s.p("    semantic_tags: [%s]   # DECIDE: what it measures", tagFor(v, s.r.RootPath))
	s.polling(v, dt)
}

// unit writes the EngineeringUnits as the manifest's unit.
func (s *skeleton) unit(v *ScannedVariable) {
	u := v.Units
	if u == nil || (u.UnitID <= 0 && strings.TrimSpace(u.DisplayName) == "") {
		s.p("    # DECIDE: unit (the server publishes no EngineeringUnits for it)")
		return
	}
	code := uneceCode(u)
	src := "EngineeringUnits " + u.DisplayName
	if code != "" {
		src += " (UNECE " + code + ")"
	} else if u.UnitID != -1 {
		src += fmt.Sprintf(" (unit id %d of %s)", u.UnitID, u.NamespaceURI)
	}
	if name, ok := uneceUnits[code]; ok {
		s.p("    unit: %s   # %s", name, oneLine(src))
		return
	}
	if strings.TrimSpace(u.DisplayName) == "" {
		s.p("    # DECIDE: unit: %s has no display name", oneLine(src))
		return
	}
	s.p("    unit: %s   # DECIDE: %s is not one of physd's unit names: kept as the server shows it", strconv.Quote(oneLine(u.DisplayName)), oneLine(src))
}

// valueRange writes the EURange as the capability's range.
func (s *skeleton) valueRange(v *ScannedVariable, dt string) {
	r := v.EURange
	if r == nil {
		return
	}
	lo, hi := r.Low, r.High
	if math.IsNaN(lo) || math.IsNaN(hi) || math.IsInf(lo, 0) || math.IsInf(hi, 0) || lo > hi {
		s.p("    # EURange %s..%s is not a range: left out", num(lo), num(hi))
		return
	}
	comment := "EURange (OPC UA Part 8)"
	if dt == manifest.TypeInt && (lo != math.Trunc(lo) || hi != math.Trunc(hi)) {
		lo, hi = math.Ceil(lo), math.Floor(hi)
		if lo > hi {
			s.p("    # EURange %s..%s holds no whole number: left out", num(r.Low), num(r.High))
			return
		}
		comment = fmt.Sprintf("EURange %s..%s, to whole numbers", num(r.Low), num(r.High))
	}
	s.p("    range: {min: %s, max: %s}   # %s", num(lo), num(hi), comment)
}

// polling writes the DECIDE comment for poll_ms and deadband.
func (s *skeleton) polling(v *ScannedVariable, dt string) {
	numeric := dt == manifest.TypeFloat || dt == manifest.TypeInt
	poll := 1000.0
	if v.MinSamplingMS > poll {
		poll = math.Ceil(v.MinSamplingMS)
	}
	sampled := ""
	if v.MinSamplingMS > 0 {
		sampled = fmt.Sprintf(" (the server samples it at most every %s ms)", num(v.MinSamplingMS))
	}
	switch {
	case numeric && v.EURange != nil && v.EURange.High > v.EURange.Low:
		band := (v.EURange.High - v.EURange.Low) / 100
		if dt == manifest.TypeInt {
			band = max(1, math.Round(band))
		}
		s.p("    # DECIDE: to stream its changes add poll_ms: %s and deadband: %s (1%% of its EURange)%s", num(poll), num(band), sampled)
	case numeric:
		s.p("    # DECIDE: to stream its changes add poll_ms: %s and a deadband in its unit%s", num(poll), sampled)
	default:
		s.p("    # DECIDE: to stream its changes add poll_ms: %s%s", num(poll), sampled)
	}
}

// description is the capability's description: what the server says of
// the node, where it is, its type and its value at scan time.
func description(v *ScannedVariable, index int) string {
	what := v.Description
	last := v.Path[len(v.Path)-1]
	switch {
	case what == "" && v.DisplayName != "":
		what = v.DisplayName
	case what == "":
		what = last
	case v.DisplayName != "" && !strings.Contains(what, v.DisplayName):
		what = v.DisplayName + ": " + what
	}
	what = strings.TrimSuffix(strings.TrimSpace(what), ".")
	where := "OPC UA " + v.PathString()
	val := v.Value
	if index >= 0 {
		where += fmt.Sprintf("[%d]", index)
		if els := elements(val); index < len(els) {
			val = els[index]
		} else {
			val = nil
		}
	}
	typ := v.DataType
	switch {
	case v.TypeName != "" && v.DataType != "":
		typ = v.TypeName + " (" + v.DataType + ")"
	case v.TypeName != "":
		typ = "DataType " + v.TypeName
	case typ == "" && v.ValueType != "":
		typ = article(v.ValueType) + " at scan time"
	case typ == "":
		typ = "no DataType"
	}
	seen := ""
	switch {
	case val != nil && v.Status != "":
		seen = "; read " + valueText(val) + " (" + v.Status + ") at scan time"
	case v.Status != "":
		seen = "; " + v.Status + " at scan time"
	case val != nil:
		seen = "; read " + valueText(val) + " at scan time"
	}
	return oneLine(fmt.Sprintf("%s (%s, %s%s).", what, where, typ, seen))
}

// valueText shows a value at scan time, short.
func valueText(x any) string {
	switch t := x.(type) {
	case float64:
		return num(t)
	case float32:
		return strconv.FormatFloat(float64(t), 'g', -1, 32)
	case string:
		if len(t) > 40 {
			t = t[:40] + "…"
		}
		return strconv.Quote(t)
	case time.Time:
		return t.UTC().Format(time.RFC3339)
	case *ua.LocalizedText:
		return valueText(text(t))
	}
	if isSlice(x) {
		els := elements(x)
		var parts []string
		for i, e := range els {
			if i == 8 {
				parts = append(parts, "…")
				break
			}
			parts = append(parts, valueText(e))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return fmt.Sprint(x)
}

// num writes a number as YAML reads it back (shortest exact form).
func num(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// tagFor is the variable's folder as a semantic tag.
func tagFor(v *ScannedVariable, root string) string {
	if len(v.Path) >= 2 {
		if t := snake(v.Path[len(v.Path)-2]); t != "" {
			return t
		}
	}
	if t := snake(root); t != "" && t != "objects" {
		return t
	}
	return "opcua"
}

// baseName is a capability name from the variable's browse path: each
// name in snake case, joined, shortened from the front to leave room
// for a suffix.
func (s *skeleton) baseName(v *ScannedVariable) string {
	var parts []string
	for _, p := range v.Path {
		if sn := snake(p); sn != "" {
			parts = append(parts, sn)
		}
	}
	const room = manifest.MaxNameLen - 8 // _<index> and _<n> suffixes
	for len(parts) > 1 && len(strings.Join(parts, "_")) > room {
		parts = parts[1:]
	}
	name := strings.Join(parts, "_")
	if name == "" {
		name = "node"
	}
	if name[0] >= '0' && name[0] <= '9' {
		name = "n_" + name
	}
	if len(name) > room {
		name = strings.TrimRight(name[:room], "_")
	}
	return name
}

// unique makes a capability name unique in the skeleton.
func (s *skeleton) unique(name string) string {
	n := name
	for i := 2; s.names[n]; i++ {
		n = fmt.Sprintf("%s_%d", name, i)
	}
	s.names[n] = true
	return n
}

var oneLine = scanskel.OneLine
