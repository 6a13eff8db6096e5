package opcua

import (
	"fmt"
	"math"
	"strings"

	"github.com/gopcua/opcua/ua"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

// bindingKeys are the structured keys of an opcua binding.
type bindingKeys struct {
	Node   *string `yaml:"node"`
	UAType *string `yaml:"ua_type"`
	Index  *int    `yaml:"index"`
}

// uaType is an OPC UA built-in type this driver reads and writes.
type uaType struct {
	name  string
	id    ua.TypeID
	class string  // the capability data types it serves: "float", "int", "bool", "string"
	lo    float64 // integer types: the range the type holds
	hi    float64
}

var uaTypes = []uaType{
	{"Boolean", ua.TypeIDBoolean, manifest.TypeBool, 0, 0},
	{"SByte", ua.TypeIDSByte, manifest.TypeInt, -128, 127},
	{"Byte", ua.TypeIDByte, manifest.TypeInt, 0, 255},
	{"Int16", ua.TypeIDInt16, manifest.TypeInt, -32768, 32767},
	{"UInt16", ua.TypeIDUint16, manifest.TypeInt, 0, 65535},
	{"Int32", ua.TypeIDInt32, manifest.TypeInt, -2147483648, 2147483647},
	{"UInt32", ua.TypeIDUint32, manifest.TypeInt, 0, 4294967295},
	{"Int64", ua.TypeIDInt64, manifest.TypeInt, -9223372036854775808, 9223372036854775807},
	{"UInt64", ua.TypeIDUint64, manifest.TypeInt, 0, 18446744073709551615},
	{"Float", ua.TypeIDFloat, manifest.TypeFloat, 0, 0},
	{"Double", ua.TypeIDDouble, manifest.TypeFloat, 0, 0},
	{"String", ua.TypeIDString, manifest.TypeString, 0, 0},
}

func uaTypeNames() string {
	n := make([]string, len(uaTypes))
	for i, t := range uaTypes {
		n[i] = t.name
	}
	return strings.Join(n, ", ")
}

func lookupType(name string) (uaType, bool) {
	for _, t := range uaTypes {
		if t.name == name {
			return t, true
		}
	}
	return uaType{}, false
}

func typeByID(id ua.TypeID) string {
	for _, t := range uaTypes {
		if t.id == id {
			return t.name
		}
	}
	return id.String()
}

// defaultType is the OPC UA type a capability's data type maps to when the
// binding names none.
func defaultType(dataType string) string {
	switch dataType {
	case manifest.TypeFloat:
		return "Double"
	case manifest.TypeInt:
		return "Int32"
	case manifest.TypeBool:
		return "Boolean"
	}
	return "String"
}

// nodeRef is a node id as written: a namespace index, or a namespace URI
// resolved against the server's namespace table at each connect (an index
// may change when the server restarts with other namespaces).
type nodeRef struct {
	text  string
	nsURI string     // "nsu=" form: the URI; id's namespace is a placeholder
	rest  string     // "nsu=" form: the identifier after the URI (i=, s=, g=, b=)
	id    *ua.NodeID // parsed; with nsURI, in namespace 0 until resolved
}

// parseNodeID accepts the OPC UA string forms i=, s=, g=, b= with an
// optional ns=<index>; or nsu=<uri>; prefix.
func parseNodeID(s string) (nodeRef, error) {
	r := nodeRef{text: s}
	rest := s
	if strings.HasPrefix(s, "nsu=") {
		uri, id, ok := strings.Cut(strings.TrimPrefix(s, "nsu="), ";")
		if !ok || uri == "" {
			return r, fmt.Errorf("node %q: nsu= needs a namespace URI and an identifier, e.g. nsu=urn:plant;s=Temperature", s)
		}
		r.nsURI, rest, r.rest = uri, id, id
	}
	if !strings.Contains(rest, "=") {
		return r, fmt.Errorf("node %q has no identifier type: write i=<number>, s=<string>, g=<guid> or b=<base64>, optionally after ns=<index>;", s)
	}
	id, err := ua.ParseNodeID(rest)
	if err != nil {
		return r, fmt.Errorf("node %q: %v", s, err)
	}
	if r.nsURI != "" && id.Namespace() != 0 {
		return r, fmt.Errorf("node %q gives both nsu= and ns=", s)
	}
	r.id = id
	return r, nil
}

// pointSpec is a validated binding.
type pointSpec struct {
	node     nodeRef
	typ      uaType
	index    int // -1: a scalar node
	writable bool
	floatCap bool // a float capability (an integer node reads as a number)
	enum     []string
}

func (s *pointSpec) what() string {
	w := "node " + s.node.text
	if s.index >= 0 {
		w += fmt.Sprintf("[%d]", s.index)
	}
	return w
}

// parseBinding validates a capability's opcua binding offline.
func parseBinding(c *manifest.Capability) (*pointSpec, error) {
	p := manifest.NewBindingErrors(c)
	if c.Binding.Type != "opcua" {
		p.Add("type", fmt.Sprintf("binding type %q on an opcua bus", c.Binding.Type), "use type: opcua, or bind the capability to a bus of type "+c.Binding.Type)
	}
	var k bindingKeys
	if errs := p.DecodeBinding(nil, &k); len(errs) > 0 {
		return nil, errs
	}
	s := &pointSpec{index: -1, writable: c.Kind == manifest.KindDo, enum: c.EnumValues, floatCap: c.DataType == manifest.TypeFloat}
	node := ""
	switch {
	case c.Binding.Address != "" && k.Node != nil:
		p.Add("node", "the node id is given both as address and as node", "keep one of them (node: ns=1;s=Setpoint)")
	case k.Node != nil:
		node = strings.TrimSpace(*k.Node)
	default:
		node = strings.TrimSpace(c.Binding.Address)
	}
	if node == "" && len(p.Errs) == 0 {
		p.Add("node", "required: which OPC UA node", "add node: ns=1;s=Temperature (or i=, g=, b= identifiers, or nsu=<namespace uri>;s=...)")
	} else if node != "" {
		r, err := parseNodeID(node)
		key := "node"
		if k.Node == nil {
			key = "address"
		}
		if err != nil {
			p.Add(key, err.Error(), "write a node id such as ns=1;s=Temperature, ns=2;i=1001, ns=3;g=72962B91-FA75-4AE6-8D28-B404DC7DAF63 or nsu=urn:plant;s=Setpoint")
		} else {
			s.node = r
		}
	}
	name := defaultType(c.DataType)
	if k.UAType != nil {
		name = *k.UAType
	}
	t, ok := lookupType(name)
	if !ok {
		p.Add("ua_type", fmt.Sprintf("ua_type %q is not supported", name), "use one of "+uaTypeNames())
	} else {
		s.typ = t
		want := c.DataType
		if want == manifest.TypeEnum {
			want = manifest.TypeString
		}
		// An integer node may serve a float capability (read as a
		// number); the other pairs must agree.
		if t.class != want && (want != manifest.TypeFloat || t.class != manifest.TypeInt) {
			p.AddCap("data_type", fmt.Sprintf("data_type %s cannot be served by OPC UA %s", c.DataType, t.name), "use data_type "+t.class+" for ua_type "+t.name+", or name the node's type in ua_type")
		}
	}
	if k.Index != nil {
		if *k.Index < 0 {
			p.Add("index", fmt.Sprintf("index %d is negative", *k.Index), "use the element's position from 0")
		} else {
			s.index = *k.Index
		}
	}
	if len(p.Errs) > 0 {
		return nil, p.Errs
	}
	return s, nil
}

// CheckBinding validates a capability's opcua binding without opening a
// bus, for `physd validate`. Errors are positioned at the key at fault.
func CheckBinding(c *manifest.Capability) error {
	_, err := parseBinding(c)
	return err
}

// WriteSpan says where a write lands: the node (an array node's whole
// extent unless the binding indexes one element), so two do_ capabilities
// on one node are refused. A node written once as ns= and once as nsu=
// is not recognised as one offline.
func (s *pointSpec) WriteSpan() (space string, start, count uint64, where string) {
	space = "opcua node " + s.node.id.String()
	if s.node.nsURI != "" {
		space = "opcua node nsu=" + s.node.nsURI + ";" + s.node.rest
	}
	if s.index < 0 {
		return space, 0, math.MaxUint32, s.what()
	}
	return space, uint64(s.index), 1, s.what()
}

// BindingSpan is the driver's offline check with the write span.
func BindingSpan(c *manifest.Capability) (drivers.Spanner, error) {
	s, err := parseBinding(c)
	if err != nil {
		return nil, err
	}
	return s, nil
}
