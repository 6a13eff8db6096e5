package opcua

import (
	"fmt"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
)

// readOp is one attribute to read and what to do with its value.
type readOp struct {
	rv    *ua.ReadValueID
	apply func(*ua.DataValue)
}

// readAll reads ops in batches the server takes (MaxNodesPerRead); it
// returns how many were read before the time ran out or a Read failed. A
// batch the server refuses as a whole with a status (BadTooManyOperations
// from a server that publishes no limit, BadResponseTooLarge for large
// array values) is halved and read again, and the smaller batches are
// kept for the rest.
func (s *scanner) readAll(ops []readOp) int {
	done := 0
	for done < len(ops) {
		if s.timeUp() {
			return done
		}
		hi := min(done+s.maxRead, len(ops))
		req := &ua.ReadRequest{TimestampsToReturn: ua.TimestampsToReturnNeither}
		for _, op := range ops[done:hi] {
			req.NodesToRead = append(req.NodesToRead, op.rv)
		}
		ctx, cancel := s.reqCtx()
		res, err := s.c.Read(ctx, req)
		cancel()
		s.rep.Requests++
		if s.refusedWhole(err, hi-done) {
			s.maxRead = max(1, (hi-done)/2)
			continue
		}
		if err != nil || len(res.Results) != hi-done {
			s.note("a Read of %d attribute(s) failed: %s", hi-done, reason(err, res, hi-done))
			return done
		}
		for k, dv := range res.Results {
			if dv != nil {
				ops[done+k].apply(dv)
			}
		}
		done = hi
	}
	return done
}

// readVariables reads every variable's attributes and properties, then
// resolves their data types.
func (s *scanner) readVariables() {
	var ops []readOp
	owner := []*node{} // the variable of each op
	for _, n := range s.vars {
		n.v = &ScannedVariable{ScannedNode: n.sn, MinSamplingMS: -1}
		for _, op := range variableOps(n) {
			ops = append(ops, op)
			owner = append(owner, n)
		}
	}
	done := s.readAll(ops)
	why := "a Read of its attributes failed (see the notes above)"
	if s.timeUp() {
		why = "the scan's time ran out before its attributes were read"
	}
	unread := 0
	for i := done; i < len(ops); i++ {
		if owner[i].v.Unread == "" {
			unread++
		}
		owner[i].v.Unread = why
	}
	if unread > 0 && s.timeUp() {
		s.rep.Limits = append(s.rep.Limits, fmt.Sprintf("--timeout %v ran out while reading: %d variable(s) not read (listed as not bound); give a larger --timeout, or scan a part with --root", s.o.Timeout, unread))
	}
	for _, n := range s.vars {
		// Both attributes are mandatory for a variable (Part 3 §5.6.2),
		// yet not every server publishes them: a missing
		// UserAccessLevel is taken to be the AccessLevel, and a missing
		// AccessLevel to be read-only.
		v := n.v
		switch {
		case v.Unread != "":
		case !n.hasAccess && !n.hasUserAccess:
			v.AccessLevel, v.UserAccessLevel = 0x01, 0x01
			v.AccessNote = "the server publishes neither AccessLevel nor UserAccessLevel: taken as read-only"
		case !n.hasUserAccess:
			v.UserAccessLevel = v.AccessLevel
			v.AccessNote = "the server publishes no UserAccessLevel: its AccessLevel is taken for this identity's"
		case !n.hasAccess:
			v.AccessLevel = v.UserAccessLevel
		}
	}
	s.resolveTypes()
	for _, n := range s.vars {
		s.rep.Variables = append(s.rep.Variables, n.v)
	}
}

// variableOps are the reads of one variable: its attributes and the
// values of the properties the browse found.
func variableOps(n *node) []readOp {
	v := n.v
	attr := func(a ua.AttributeID, apply func(val any)) readOp {
		return readOp{rv: &ua.ReadValueID{NodeID: n.id, AttributeID: a}, apply: func(dv *ua.DataValue) {
			if dv.Status == ua.StatusOK && dv.Value != nil {
				apply(dv.Value.Value())
			}
		}}
	}
	ops := []readOp{
		attr(ua.AttributeIDDisplayName, func(x any) { v.DisplayName = text(x) }),
		attr(ua.AttributeIDDescription, func(x any) { v.Description = text(x) }),
		attr(ua.AttributeIDDataType, func(x any) {
			switch t := x.(type) {
			case *ua.NodeID:
				n.dataType = t
			case *ua.ExpandedNodeID: // a NodeId is asked for; some servers send this
				if t != nil && t.ServerIndex == 0 && t.NamespaceURI == "" {
					n.dataType = ua.NewNodeIDFromExpandedNodeID(t)
				}
			}
		}),
		attr(ua.AttributeIDValueRank, func(x any) {
			if r, ok := x.(int32); ok {
				v.ValueRank = r
			}
		}),
		attr(ua.AttributeIDArrayDimensions, func(x any) {
			if d, ok := x.([]uint32); ok {
				v.ArrayDims = d
			}
		}),
		attr(ua.AttributeIDAccessLevel, func(x any) {
			if b, ok := x.(uint8); ok {
				v.AccessLevel, n.hasAccess = b, true
			}
		}),
		attr(ua.AttributeIDUserAccessLevel, func(x any) {
			if b, ok := x.(uint8); ok {
				v.UserAccessLevel, n.hasUserAccess = b, true
			}
		}),
		attr(ua.AttributeIDMinimumSamplingInterval, func(x any) {
			if f, ok := x.(float64); ok && f >= 0 {
				v.MinSamplingMS = f
			}
		}),
		{rv: &ua.ReadValueID{NodeID: n.id, AttributeID: ua.AttributeIDValue}, apply: func(dv *ua.DataValue) {
			if dv.Status != ua.StatusOK {
				v.Status = statusName(dv.Status)
			}
			if dv.Value != nil && dv.Value.Value() != nil {
				v.Value, v.ValueType = dv.Value.Value(), builtinName(uint32(dv.Value.Type()))
			}
		}},
	}
	// The value rank's default is -1 (scalar) where the attribute is
	// missing; set it before the read that may overwrite it.
	v.ValueRank = -1
	prop := func(name string, apply func(val any)) {
		if pid, ok := n.propID[name]; ok {
			ops = append(ops, readOp{rv: &ua.ReadValueID{NodeID: pid, AttributeID: ua.AttributeIDValue}, apply: func(dv *ua.DataValue) {
				if dv.Status == ua.StatusOK && dv.Value != nil {
					apply(dv.Value.Value())
				}
			}})
		}
	}
	prop("EURange", func(x any) {
		if eo, ok := x.(*ua.ExtensionObject); ok {
			if r, ok := eo.Value.(*ua.Range); ok && r != nil {
				v.EURange = &EURange{Low: r.Low, High: r.High}
			}
		}
	})
	prop("EngineeringUnits", func(x any) {
		if eo, ok := x.(*ua.ExtensionObject); ok {
			if u, ok := eo.Value.(*ua.EUInformation); ok && u != nil {
				v.Units = &EngineeringUnits{NamespaceURI: u.NamespaceURI, UnitID: u.UnitID, DisplayName: text(u.DisplayName), Description: text(u.Description)}
			}
		}
	})
	prop("EnumStrings", func(x any) {
		if ls, ok := x.([]*ua.LocalizedText); ok {
			for _, l := range ls {
				v.EnumStrings = append(v.EnumStrings, text(l))
			}
		}
	})
	return ops
}

// text is a LocalizedText's (or a string's) text.
func text(x any) string {
	switch t := x.(type) {
	case *ua.LocalizedText:
		if t != nil {
			return t.Text
		}
	case string:
		return t
	}
	return ""
}

// builtinNames are the built-in DataTypes (Part 6 §5.1.2: the node ids
// i=1..25 of namespace 0) and the abstract ones physd meets as DataTypes
// (i=26..29).
var builtinNames = map[uint32]string{
	1: "Boolean", 2: "SByte", 3: "Byte", 4: "Int16", 5: "UInt16", 6: "Int32", 7: "UInt32", 8: "Int64", 9: "UInt64",
	10: "Float", 11: "Double", 12: "String", 13: "DateTime", 14: "Guid", 15: "ByteString", 16: "XmlElement", 17: "NodeId",
	18: "ExpandedNodeId", 19: "StatusCode", 20: "QualifiedName", 21: "LocalizedText", 22: "Structure", 23: "DataValue",
	24: "BaseDataType", 25: "DiagnosticInfo", 26: "Number", 27: "Integer", 28: "UInteger", 29: "Enumeration",
}

func builtinName(i uint32) string {
	if n, ok := builtinNames[i]; ok {
		return n
	}
	return fmt.Sprintf("type %d", i)
}

// typeClass is what kind of type a namespace 0 id of builtinNames is.
func typeClass(i uint32) string {
	switch i {
	case id.Structure:
		return "structure"
	case id.BaseDataType, id.Number, id.Integer, id.UInteger:
		return "abstract"
	case id.Enumeration:
		return "enumeration"
	}
	return "builtin"
}

// typeInfo is a DataType resolved: the built-in type it derives from.
type typeInfo struct {
	base  uint32 // the namespace 0 id of builtinNames it resolves to; 0: unresolved
	name  string // the DataType's own browse name
	super *ua.NodeID
}

// resolveTypes resolves each variable's DataType to the built-in type it
// derives from (Duration is a Double, an enumeration an Enumeration),
// following HasSubtype inverse up to ten levels, and reads the names of
// the types that are not built-in.
func (s *scanner) resolveTypes() {
	types := map[string]*typeInfo{}
	var pending []*ua.NodeID // non-built-in types whose base is not known yet
	for _, n := range s.vars {
		t := n.dataType
		if t == nil {
			continue
		}
		k := t.String()
		if _, ok := types[k]; ok {
			continue
		}
		if t.Namespace() == 0 && builtinNames[t.IntID()] != "" {
			types[k] = &typeInfo{base: t.IntID(), name: builtinNames[t.IntID()]}
			continue
		}
		types[k] = &typeInfo{super: t}
		pending = append(pending, t)
	}
	if len(pending) > 0 {
		var ops []readOp
		for _, t := range pending {
			ti := types[t.String()]
			ops = append(ops, readOp{rv: &ua.ReadValueID{NodeID: t, AttributeID: ua.AttributeIDBrowseName}, apply: func(dv *ua.DataValue) {
				if dv.Value != nil {
					if q, ok := dv.Value.Value().(*ua.QualifiedName); ok && q != nil {
						ti.name = q.Name
					}
				}
			}})
		}
		s.readAll(ops)
	}
	for round := 0; round < 10 && len(pending) > 0 && !s.timeUp(); round++ {
		var items []browseItem
		for _, t := range pending {
			items = append(items, browseItem{n: &node{id: t, sn: ScannedNode{NodeID: t.String(), Path: []string{"DataType " + t.String()}}}, desc: &ua.BrowseDescription{
				NodeID: types[t.String()].super, BrowseDirection: ua.BrowseDirectionInverse,
				ReferenceTypeID: ua.NewNumericNodeID(0, id.HasSubtype), NodeClassMask: uint32(ua.NodeClassDataType),
				ResultMask: uint32(ua.BrowseResultMaskAll),
			}})
		}
		refs, browsed := s.browseNoBudget(items)
		var next []*ua.NodeID
		for i, t := range pending {
			ti := types[t.String()]
			if !browsed[i] || len(refs[i]) == 0 || refs[i][0].NodeID == nil {
				continue // unresolved: listed as such
			}
			sup := s.localID(refs[i][0].NodeID)
			if sup == nil {
				continue
			}
			if sup.Namespace() == 0 && builtinNames[sup.IntID()] != "" {
				ti.base = sup.IntID()
				continue
			}
			ti.super = sup
			next = append(next, t)
		}
		pending = next
	}
	for _, n := range s.vars {
		v := n.v
		if n.dataType == nil {
			v.TypeClass = "unknown"
			continue
		}
		ti := types[n.dataType.String()]
		if ti.base == 0 {
			v.TypeClass, v.TypeName = "unknown", ti.name
			if v.TypeName == "" {
				v.TypeName = n.dataType.String()
			}
			continue
		}
		v.DataType, v.TypeClass = builtinNames[ti.base], typeClass(ti.base)
		if !(n.dataType.Namespace() == 0 && n.dataType.IntID() == ti.base) {
			v.TypeName = ti.name
			if v.TypeName == "" {
				v.TypeName = n.dataType.String()
			}
		}
	}
}

// browseNoBudget browses items within the scan's time, not the browse's
// share of it: the type lookups come after the browse.
func (s *scanner) browseNoBudget(items []browseItem) ([][]*ua.ReferenceDescription, []bool) {
	saved := s.browseBy
	s.browseBy = s.deadline
	defer func() { s.browseBy = saved }()
	return s.browse(items)
}
