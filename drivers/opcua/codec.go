package opcua

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/gopcua/opcua/ua"
	"github.com/physd/physd/drivers"
)

// decode turns a read's Variant into the capability's Go type (float64,
// int64, bool, string). The node must hold the binding's ua_type; an array
// is refused unless the binding indexes one element.
func (p *point) decode(v *ua.Variant) (any, error) {
	s := p.spec
	if v == nil || v.Value() == nil {
		return nil, fmt.Errorf("opcua %s: %s holds no value", p.bus.spec.name, s.what())
	}
	if v.Type() != s.typ.id {
		return nil, &typeError{what: s.what(), got: typeByID(v.Type()), want: s.typ.name}
	}
	val := v.Value()
	if v.ArrayLength() > 0 || isSlice(val) {
		if s.index < 0 {
			return nil, &arrayError{what: s.what(), n: int(v.ArrayLength())}
		}
		els := elements(val)
		if len(els) != 1 {
			return nil, &indexRangeError{what: s.what(), n: len(els)}
		}
		val = els[0]
	}
	switch x := val.(type) {
	case bool:
		return x, nil
	case int8:
		return p.num(int64(x)), nil
	case uint8:
		return p.num(int64(x)), nil
	case int16:
		return p.num(int64(x)), nil
	case uint16:
		return p.num(int64(x)), nil
	case int32:
		return p.num(int64(x)), nil
	case uint32:
		return p.num(int64(x)), nil
	case int64:
		return p.num(x), nil
	case uint64:
		if x > math.MaxInt64 {
			return nil, fmt.Errorf("opcua %s: %s holds %d, beyond a 64-bit signed integer", p.bus.spec.name, s.what(), x)
		}
		return p.num(int64(x)), nil
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	case string:
		if len(s.enum) > 0 && !slices.Contains(s.enum, x) {
			return nil, fmt.Errorf("opcua %s: %s holds %q, not one of the capability's enum_values %v", p.bus.spec.name, s.what(), x, s.enum)
		}
		return x, nil
	}
	return nil, fmt.Errorf("opcua %s: %s holds a %T", p.bus.spec.name, s.what(), val)
}

// num is an integer node's value as the capability's type (int, or float
// for a float capability on an integer node).
func (p *point) num(i int64) any {
	if p.spec.typ.class == "int" && p.isFloatCap() {
		return float64(i)
	}
	return i
}

func (p *point) isFloatCap() bool { return p.spec.floatCap }

func isSlice(v any) bool {
	switch v.(type) {
	case []bool, []int8, []uint8, []int16, []uint16, []int32, []uint32, []int64, []uint64, []float32, []float64, []string:
		return true
	}
	return false
}

func elements(v any) []any {
	var out []any
	add := func(n int, at func(int) any) {
		for i := range n {
			out = append(out, at(i))
		}
	}
	switch x := v.(type) {
	case []bool:
		add(len(x), func(i int) any { return x[i] })
	case []int8:
		add(len(x), func(i int) any { return x[i] })
	case []uint8:
		add(len(x), func(i int) any { return x[i] })
	case []int16:
		add(len(x), func(i int) any { return x[i] })
	case []uint16:
		add(len(x), func(i int) any { return x[i] })
	case []int32:
		add(len(x), func(i int) any { return x[i] })
	case []uint32:
		add(len(x), func(i int) any { return x[i] })
	case []int64:
		add(len(x), func(i int) any { return x[i] })
	case []uint64:
		add(len(x), func(i int) any { return x[i] })
	case []float32:
		add(len(x), func(i int) any { return x[i] })
	case []float64:
		add(len(x), func(i int) any { return x[i] })
	case []string:
		add(len(x), func(i int) any { return x[i] })
	}
	return out
}

// encode turns a command into the Variant of the binding's ua_type (one
// element array for an indexed binding) and, for numbers, its float64
// for the EURange check. A value the type cannot hold wraps ErrBadValue.
func (p *point) encode(v any) (*ua.Variant, float64, error) {
	s := p.spec
	bad := func(format string, args ...any) error {
		return fmt.Errorf("opcua %s: %s: %s: %w", p.bus.spec.name, s.what(), fmt.Sprintf(format, args...), drivers.ErrBadValue)
	}
	var val any
	var f float64
	switch s.typ.class {
	case "bool":
		b, ok := v.(bool)
		if !ok {
			return nil, 0, bad("a Boolean node takes true or false, not %T", v)
		}
		val = b
	case "string":
		str, ok := v.(string)
		if !ok {
			return nil, 0, bad("a String node takes a string, not %T", v)
		}
		val = str
	case "float":
		switch x := v.(type) {
		case float64:
			f = x
		case int64:
			f = float64(x)
		default:
			return nil, 0, bad("a %s node takes a number, not %T", s.typ.name, v)
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, 0, bad("%v is not a finite number", f)
		}
		if s.typ.id == ua.TypeIDFloat {
			if math.Abs(f) > math.MaxFloat32 {
				return nil, 0, bad("%v is beyond a Float's range", f)
			}
			val = float32(f)
		} else {
			val = f
		}
	case "int":
		var i int64
		switch x := v.(type) {
		case int64:
			i = x
		case float64:
			if x != math.Trunc(x) {
				return nil, 0, bad("%v is not a whole number; an %s node holds integers: write %v or %v", x, s.typ.name, math.Floor(x), math.Ceil(x))
			}
			i = int64(x)
		default:
			return nil, 0, bad("an %s node takes an integer, not %T", s.typ.name, v)
		}
		if float64(i) < s.typ.lo || float64(i) > s.typ.hi {
			return nil, 0, bad("%d is outside %s (%v..%v)", i, s.typ.name, s.typ.lo, s.typ.hi)
		}
		f = float64(i)
		val = intOf(s.typ.id, i)
	}
	if s.index >= 0 {
		val = oneElement(val)
	}
	variant, err := ua.NewVariant(val)
	if err != nil {
		return nil, 0, bad("%v", err)
	}
	return variant, f, nil
}

func intOf(id ua.TypeID, i int64) any {
	switch id {
	case ua.TypeIDSByte:
		return int8(i)
	case ua.TypeIDByte:
		return uint8(i)
	case ua.TypeIDInt16:
		return int16(i)
	case ua.TypeIDUint16:
		return uint16(i)
	case ua.TypeIDInt32:
		return int32(i)
	case ua.TypeIDUint32:
		return uint32(i)
	case ua.TypeIDUint64:
		return uint64(i)
	}
	return i
}

func oneElement(v any) any {
	switch x := v.(type) {
	case bool:
		return []bool{x}
	case int8:
		return []int8{x}
	case uint8:
		return []uint8{x}
	case int16:
		return []int16{x}
	case uint16:
		return []uint16{x}
	case int32:
		return []int32{x}
	case uint32:
		return []uint32{x}
	case int64:
		return []int64{x}
	case uint64:
		return []uint64{x}
	case float32:
		return []float32{x}
	case float64:
		return []float64{x}
	case string:
		return []string{x}
	}
	return v
}

// Status codes: the top two bits are the severity (OPC UA Part 4 §7.39).
func isBad(st ua.StatusCode) bool       { return uint32(st)&0xC0000000 == 0x80000000 }
func isGood(st ua.StatusCode) bool      { return uint32(st)&0xC0000000 == 0 }
func isUncertain(st ua.StatusCode) bool { return uint32(st)&0xC0000000 == 0x40000000 }

// statusName is a status code's symbolic name (BadSensorFailure), or its
// hex value when gopcua does not know it.
func statusName(st ua.StatusCode) string {
	d, ok := ua.StatusCodes[st]
	if !ok {
		// Info bits (the low 16) do not change the code's meaning.
		d, ok = ua.StatusCodes[st&0xFFFF0000]
	}
	if !ok {
		return fmt.Sprintf("0x%08X", uint32(st))
	}
	return specName.Replace(strings.TrimPrefix(d.Name, "Status"))
}

// specName undoes gopcua's Go spelling of the status names (NodeID, TCP,
// URI, URL) so they read as OPC UA Part 4 and the servers' logs spell them
// (BadNodeIdUnknown, BadTcpMessageTooLarge).
var specName = strings.NewReplacer("ID", "Id", "TCP", "Tcp", "URI", "Uri", "URL", "Url")

// statusError is a Bad status code for a node: its code is the status
// name, so an agent sees "BadSensorFailure", not a number. A write's Bad
// result wraps ErrBadValue: the server answered and applied nothing.
type statusError struct {
	what   string
	status ua.StatusCode
	write  bool
	op     string
	detail string
}

func (e *statusError) Error() string {
	op := e.op
	if op == "" {
		op = "read"
		if e.write {
			op = "write"
		}
	}
	msg := fmt.Sprintf("OPC UA %s %s: %s", op, e.what, statusName(e.status))
	if d, ok := ua.StatusCodes[e.status]; ok && d.Text != "" {
		msg += " (" + strings.TrimSuffix(d.Text, ".") + ")"
	}
	if e.detail != "" {
		msg += ": " + e.detail
	}
	return msg
}

func (e *statusError) Code() string { return statusName(e.status) }

func (e *statusError) Fix() string {
	if e.op == "connect" {
		switch e.status {
		case ua.StatusBadIdentityTokenRejected, ua.StatusBadIdentityTokenInvalid, ua.StatusBadUserAccessDenied:
			return "the server refused physd's identity: check username and the password in password_env, or that the server trusts user_certificate"
		case ua.StatusBadCertificateUntrusted, ua.StatusBadSecurityChecksFailed, ua.StatusBadCertificateURIInvalid:
			return "the server does not trust physd's application certificate: add it to the server's trusted certificates (or give certificate: and private_key: the server already trusts)"
		}
		return "check the server's log for why it refused the session"
	}
	switch e.status {
	case ua.StatusBadNodeIDUnknown, ua.StatusBadNodeIDInvalid:
		return "check the binding's node id against the server's address space (browse it with a client such as UaExpert)"
	case ua.StatusBadNotWritable, ua.StatusBadUserAccessDenied, ua.StatusBadNotReadable:
		return "the server's access level for this node (or this user) does not allow it: bind another node, or change the user's rights on the server"
	case ua.StatusBadTypeMismatch:
		return "set ua_type to the node's DataType"
	case ua.StatusBadOutOfRange:
		return "write a value within the node's range"
	case ua.StatusBadIndexRangeInvalid, ua.StatusBadIndexRangeNoData:
		return "check index: against the node's array length"
	case ua.StatusBadSessionIDInvalid, ua.StatusBadSessionClosed, ua.StatusBadSecureChannelIDInvalid, ua.StatusBadConnectionClosed:
		return "the session ended; physd reconnects: try again in a moment"
	}
	if isBad(e.status) && !e.write {
		return "the server reports the value unusable: check the device behind the node before acting"
	}
	return "read the node's status on the server before trying again"
}

// Unwrap marks a Bad write result as one that applied nothing; an
// Uncertain one may have been applied (the node reads back).
func (e *statusError) Unwrap() error {
	if e.write && isBad(e.status) {
		return drivers.ErrBadValue
	}
	return nil
}

// rangeError is a command outside the node's EURange: refused before
// anything is sent.
type rangeError struct {
	what      string
	v, lo, hi float64
}

func (e *rangeError) Error() string {
	return fmt.Sprintf("%v is outside the EURange %v..%v the server publishes for %s (nothing written)", e.v, e.lo, e.hi, e.what)
}
func (e *rangeError) Code() string { return "outside_eu_range" }
func (e *rangeError) Fix() string {
	return fmt.Sprintf("write a value between %v and %v (the node's engineering range)", e.lo, e.hi)
}
func (e *rangeError) Unwrap() error { return drivers.ErrBadValue }

// typeError is a node whose value is of another type than the binding's.
type typeError struct{ what, got, want string }

func (e *typeError) Error() string {
	return fmt.Sprintf("%s holds a %s, the binding says ua_type %s", e.what, e.got, e.want)
}
func (e *typeError) Code() string { return "type_mismatch" }
func (e *typeError) Fix() string  { return "set ua_type: " + e.got + " (and a data_type that fits it)" }

// indexRangeError is a server that answered a Read of one element with
// another number of them: it ignores IndexRange (gopcua's server,
// python-asyncua), and would take a write of one element for the whole
// array, so nothing is written through the binding.
type indexRangeError struct {
	what string
	n    int
}

func (e *indexRangeError) Error() string {
	return fmt.Sprintf("%s: the server returned %d elements for one index: it ignores IndexRange, so an element can be neither read nor written safely", e.what, e.n)
}
func (e *indexRangeError) Code() string { return "index_range_ignored" }
func (e *indexRangeError) Fix() string {
	return "bind a scalar node that holds the element (the server's integrator can add one), or update the server: it must honour IndexRange"
}

// arrayError is an array node bound without an index.
type arrayError struct {
	what string
	n    int
}

func (e *arrayError) Error() string {
	return fmt.Sprintf("%s holds an array of %d elements; a capability reads one value: bind one element with index: N (from 0)", e.what, e.n)
}
func (e *arrayError) Code() string { return "array_not_indexed" }
func (e *arrayError) Fix() string  { return "add index: N to bind element N (from 0)" }
