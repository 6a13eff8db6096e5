package opcua

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
)

// node is a node met while browsing.
type node struct {
	id       *ua.NodeID
	class    ua.NodeClass
	depth    int
	sn       ScannedNode
	propID   map[string]*ua.NodeID // the properties the skeleton uses, by browse name
	dataType *ua.NodeID            // a variable's DataType attribute
	// hasAccess and hasUserAccess say whether the server published the
	// variable's AccessLevel and UserAccessLevel.
	hasAccess, hasUserAccess bool
	v                        *ScannedVariable // a variable's attributes
}

// properties are the properties of a variable the skeleton uses: the
// Part 8 range and units, and the names of a MultiStateDiscrete's values.
var properties = []string{"EURange", "EngineeringUnits", "EnumStrings"}

// browseItem is one node to browse and how.
type browseItem struct {
	n         *node
	propsOnly bool // only its properties (a variable at the depth limit)
	desc      *ua.BrowseDescription
}

// description is what a browse of the item asks: the hierarchical
// references forward (HasComponent, Organizes, HasProperty and their
// subtypes), to objects, variables and methods; or only HasProperty.
func (it browseItem) description() *ua.BrowseDescription {
	if it.desc != nil {
		return it.desc
	}
	ref, mask := uint32(id.HierarchicalReferences), uint32(ua.NodeClassObject|ua.NodeClassVariable|ua.NodeClassMethod)
	if it.propsOnly {
		ref, mask = id.HasProperty, uint32(ua.NodeClassVariable)
	}
	return &ua.BrowseDescription{
		NodeID:          it.n.id,
		BrowseDirection: ua.BrowseDirectionForward,
		ReferenceTypeID: ua.NewNumericNodeID(0, ref),
		IncludeSubtypes: true,
		NodeClassMask:   mask,
		ResultMask:      uint32(ua.BrowseResultMaskAll),
	}
}

// isProperty says whether a reference is HasProperty.
func isProperty(ref *ua.NodeID) bool {
	return ref != nil && ref.Namespace() == 0 && ref.IntID() == id.HasProperty
}

// skipReference leaves out the hierarchical references that do not make
// the address space's tree: the event notifier hierarchy (HasEventSource,
// HasNotifier) and the type hierarchy (HasSubtype).
func skipReference(ref *ua.NodeID) bool {
	if ref == nil || ref.Namespace() != 0 {
		return false
	}
	switch ref.IntID() {
	case id.HasEventSource, id.HasNotifier, id.HasSubtype:
		return true
	}
	return false
}

// browseAll walks the address space breadth first from the root, so a
// node reached along two paths is named after the shorter one; the
// skeleton lists the nodes depth first, in the server's order.
func (s *scanner) browseAll() error {
	rootText := s.o.Root
	if rootText == "" {
		rootText = "i=85"
	}
	s.rep.Root = rootText
	ref, err := parseNodeID(rootText)
	if err != nil {
		return scanErr("root", "root_invalid", err.Error(), "the Objects folder is i=85")
	}
	rid, err := (&point{bus: &Bus{spec: s.spec}, spec: &pointSpec{node: ref, index: -1}}).nodeID(s.c)
	if err != nil {
		return scanErr("root", "root_unknown", "root "+rootText+": "+err.Error(), "give a node the server has; the Objects folder is i=85")
	}
	root, err := s.readRoot(rid)
	if err != nil {
		return err
	}
	s.rep.RootPath = root.sn.Path[0]
	root.sn.Path = nil
	s.visited[rid.String()] = true
	var methods []*node
	if root.class == ua.NodeClassVariable {
		root.sn.Path = []string{s.rep.RootPath}
		s.vars = append(s.vars, root)
	}
	var depthCut, nodeCut, timeCut int
	for level := []*node{root}; len(level) > 0; {
		var items []browseItem
		for _, n := range level {
			switch {
			case n.depth < s.o.Depth && s.rep.Nodes < s.o.MaxNodes:
				items = append(items, browseItem{n: n})
			case n.class == ua.NodeClassVariable:
				items = append(items, browseItem{n: n, propsOnly: true})
			case n.depth >= s.o.Depth:
				depthCut++
			default:
				nodeCut++
			}
		}
		refs, browsed := s.browse(items)
		var next []*node
		for i, it := range items {
			if !browsed[i] {
				if !it.propsOnly && s.browseTimeUp() {
					timeCut++
				}
				continue
			}
			for j, r := range refs[i] {
				c, cut := s.follow(it, j, r, root)
				nodeCut += cut
				switch {
				case c == nil:
				case c.class == ua.NodeClassMethod:
					methods = append(methods, c)
				default:
					if c.class == ua.NodeClassVariable {
						s.vars = append(s.vars, c)
					}
					next = append(next, c)
				}
			}
		}
		if s.browseTimeUp() {
			for _, n := range next {
				if n.class == ua.NodeClassObject {
					timeCut++
				}
			}
			break
		}
		level = next
	}
	if depthCut > 0 {
		s.rep.Limits = append(s.rep.Limits, fmt.Sprintf("stopped at depth %d: %d object(s) there not browsed; browse one with --root and its node id, or give a larger --depth", s.o.Depth, depthCut))
	}
	if nodeCut > 0 {
		s.rep.Limits = append(s.rep.Limits, fmt.Sprintf("stopped at %d nodes (--max-nodes): %d more node(s) not followed; browse a part with --root, or give a larger --max-nodes", s.o.MaxNodes, nodeCut))
	}
	if timeCut > 0 {
		s.rep.Limits = append(s.rep.Limits, fmt.Sprintf("browsing stopped at 70%% of --timeout %v (the rest reads what was found): %d node(s) not browsed; browse a part with --root, or give a larger --timeout", s.o.Timeout, timeCut))
	}
	sortNodes(s.vars)
	sortNodes(methods)
	for _, m := range methods {
		s.rep.Methods = append(s.rep.Methods, &m.sn)
	}
	return nil
}

// follow records the target of reference r, the j-th of it.n's, and
// returns it when it is a node to list (nil: a property, a node met
// before, or one left out; cut counts a node the node limit left out).
func (s *scanner) follow(it browseItem, j int, r *ua.ReferenceDescription, root *node) (*node, int) {
	n := it.n
	if r == nil || r.NodeID == nil || r.NodeID.ServerIndex != 0 {
		return nil, 0 // a node on another server
	}
	tid := s.localID(r.NodeID)
	if tid == nil {
		return nil, 0
	}
	name := ""
	if r.BrowseName != nil {
		name = r.BrowseName.Name
	}
	if isProperty(r.ReferenceTypeID) {
		if n.class == ua.NodeClassVariable && slices.Contains(properties, name) {
			n.propID[name] = tid
		}
		return nil, 0
	}
	if it.propsOnly || skipReference(r.ReferenceTypeID) || s.visited[tid.String()] {
		return nil, 0
	}
	if r.NodeClass != ua.NodeClassObject && r.NodeClass != ua.NodeClassVariable && r.NodeClass != ua.NodeClassMethod {
		return nil, 0
	}
	c := &node{id: tid, class: r.NodeClass, depth: n.depth + 1, propID: map[string]*ua.NodeID{}}
	c.sn.Path = append(slices.Clip(n.sn.Path), name)
	c.sn.order = append(slices.Clip(n.sn.order), j)
	c.sn.NodeID, c.sn.NodeNote = s.nodeText(tid)
	if s.o.Root == "" && n == root && tid.Namespace() == 0 {
		// The Server object and the other standard nodes under Objects:
		// the server's own diagnostics, not the plant.
		s.visited[tid.String()] = true
		s.rep.NotBrowsed = append(s.rep.NotBrowsed, &c.sn)
		return nil, 0
	}
	if s.rep.Nodes >= s.o.MaxNodes {
		return nil, 1
	}
	s.visited[tid.String()] = true
	s.rep.Nodes++
	return c, 0
}

// readRoot reads the root's node class and browse name.
func (s *scanner) readRoot(rid *ua.NodeID) (*node, error) {
	ctx, cancel := s.reqCtx()
	defer cancel()
	res, err := s.c.Read(ctx, &ua.ReadRequest{TimestampsToReturn: ua.TimestampsToReturnNeither, NodesToRead: []*ua.ReadValueID{
		{NodeID: rid, AttributeID: ua.AttributeIDNodeClass}, {NodeID: rid, AttributeID: ua.AttributeIDBrowseName}}})
	s.rep.Requests++
	if err != nil {
		return nil, scanErr("", "read_failed", fmt.Sprintf("reading the root %s: %v", s.rep.Root, oneLine(err.Error())), "check that the server answers within timeout_ms, or give a larger --timeout-ms")
	}
	if len(res.Results) != 2 || res.Results[0].Status != ua.StatusOK || res.Results[0].Value == nil {
		st := ua.StatusBadUnexpectedError
		if len(res.Results) > 0 {
			st = res.Results[0].Status
		}
		return nil, scanErr("root", statusName(st), fmt.Sprintf("root %s: %s", s.rep.Root, statusName(st)), "give a node the server has; the Objects folder is i=85")
	}
	n := &node{id: rid, propID: map[string]*ua.NodeID{}}
	if c, ok := res.Results[0].Value.Value().(int32); ok {
		n.class = ua.NodeClass(c)
	}
	name := s.rep.Root
	if res.Results[1].Value != nil {
		if q, ok := res.Results[1].Value.Value().(*ua.QualifiedName); ok && q != nil && q.Name != "" {
			name = q.Name
		}
	}
	n.sn.Path = []string{name}
	n.sn.NodeID, n.sn.NodeNote = s.nodeText(rid)
	return n, nil
}

// browseTimeUp says whether the browse's share of the scan's time is over.
func (s *scanner) browseTimeUp() bool {
	return s.timeUp() || !time.Now().Before(s.browseBy)
}

// browse browses items, in batches the server takes, following every
// continuation point with BrowseNext. browsed[i] is false for an item the
// time left no room for (or whose browse failed; a note says why).
func (s *scanner) browse(items []browseItem) (refs [][]*ua.ReferenceDescription, browsed []bool) {
	refs = make([][]*ua.ReferenceDescription, len(items))
	browsed = make([]bool, len(items))
	for lo := 0; lo < len(items); {
		if s.browseTimeUp() {
			return refs, browsed
		}
		hi := min(lo+s.maxBrowse, len(items))
		req := &ua.BrowseRequest{RequestedMaxReferencesPerNode: s.o.MaxReferencesPerNode}
		for _, it := range items[lo:hi] {
			req.NodesToBrowse = append(req.NodesToBrowse, it.description())
		}
		ctx, cancel := s.reqCtx()
		res, err := s.c.Browse(ctx, req)
		cancel()
		s.rep.Requests++
		if s.refusedWhole(err, hi-lo) {
			s.maxBrowse = max(1, (hi-lo)/2)
			continue
		}
		if err != nil || len(res.Results) != hi-lo {
			s.note("a Browse of %d node(s) failed: %s; they are not browsed", hi-lo, reason(err, res, hi-lo))
			return refs, browsed
		}
		var pending []int // items with a continuation point
		var cps [][]byte
		for k, r := range res.Results {
			i := lo + k
			if !s.browseResult(items[i], r) {
				continue
			}
			refs[i] = append(refs[i], r.References...)
			browsed[i] = true
			if len(r.ContinuationPoint) > 0 {
				pending, cps = append(pending, i), append(cps, r.ContinuationPoint)
			}
		}
		for len(pending) > 0 {
			if s.browseTimeUp() {
				s.release(cps)
				for _, i := range pending {
					browsed[i] = false
				}
				return refs, browsed
			}
			ctx, cancel := s.reqCtx()
			nres, err := s.c.BrowseNext(ctx, &ua.BrowseNextRequest{ContinuationPoints: cps})
			cancel()
			s.rep.Requests++
			if err != nil || len(nres.Results) != len(cps) {
				s.note("a BrowseNext of %d continuation point(s) failed: %s; those nodes' further references are not listed", len(cps), reason(err, nres, len(cps)))
				break
			}
			var p2 []int
			var c2 [][]byte
			for k, r := range nres.Results {
				i := pending[k]
				if !s.browseResult(items[i], r) {
					continue
				}
				refs[i] = append(refs[i], r.References...)
				if len(r.ContinuationPoint) > 0 {
					p2, c2 = append(p2, i), append(c2, r.ContinuationPoint)
				}
			}
			pending, cps = p2, c2
		}
		lo = hi
	}
	return refs, browsed
}

// refusedWhole says whether a request of n operations was refused as a
// whole with a Bad status (BadTooManyOperations from a server that
// publishes no limit, BadResponseTooLarge), so that half as many may pass.
func (s *scanner) refusedWhole(err error, n int) bool {
	var st ua.StatusCode
	return err != nil && errors.As(err, &st) && isBad(st) && n > 1 && s.ctx.Err() == nil
}

// browseResult notes a Bad browse result; it says whether r is usable.
func (s *scanner) browseResult(it browseItem, r *ua.BrowseResult) bool {
	if r == nil {
		return false
	}
	if isBad(r.StatusCode) {
		s.note("browsing %s (%s): %s", pathOr(it.n.sn), it.n.sn.NodeID, statusName(r.StatusCode))
		return false
	}
	return true
}

// release gives continuation points back to the server (Part 4 §5.8.3):
// each holds resources there until the session ends.
func (s *scanner) release(cps [][]byte) {
	if len(cps) == 0 {
		return
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	_, _ = s.c.BrowseNext(ctx, &ua.BrowseNextRequest{ReleaseContinuationPoints: true, ContinuationPoints: cps})
	s.rep.Requests++
}

func (s *scanner) note(format string, a ...any) {
	s.rep.Notes = append(s.rep.Notes, fmt.Sprintf(format, a...))
}

// reason says why a service call's answer is unusable: its error, or a
// result count that does not match the request's.
func reason(err error, res any, want int) string {
	if err != nil {
		var st ua.StatusCode
		if errors.As(err, &st) {
			return statusName(st)
		}
		return oneLine(err.Error())
	}
	got := 0
	switch r := res.(type) {
	case *ua.BrowseResponse:
		if r != nil {
			got = len(r.Results)
		}
	case *ua.BrowseNextResponse:
		if r != nil {
			got = len(r.Results)
		}
	case *ua.ReadResponse:
		if r != nil {
			got = len(r.Results)
		}
	}
	return fmt.Sprintf("%d results for %d", got, want)
}

func pathOr(n ScannedNode) string {
	if len(n.Path) == 0 {
		return "the root"
	}
	return n.PathString()
}

// localID is a reference's target as a node id of this session: an
// expanded node id that names its namespace by URI is looked up in the
// namespace table.
func (s *scanner) localID(e *ua.ExpandedNodeID) *ua.NodeID {
	nid := ua.NewNodeIDFromExpandedNodeID(e)
	if e.NamespaceURI == "" {
		return nid
	}
	i := slices.Index(s.rep.Namespaces, e.NamespaceURI)
	if i < 0 || nid.SetNamespace(uint16(i)) != nil {
		return nil
	}
	return nid
}

// nodeText writes a node id as a binding does, with its namespace by URI
// (nsu=), so that a server that reorders its namespace table keeps the
// skeleton right. Where the URI cannot be written that way (a ';' in it or
// in a string identifier, which the binding's syntax splits on), it is
// the ns= form and note says why; a node id no binding can carry (a
// string identifier with spaces at its ends, which the binding trims) has
// a note beginning "cannot".
func (s *scanner) nodeText(nid *ua.NodeID) (text, note string) {
	ns := nid.Namespace()
	var ident string
	switch nid.Type() {
	case ua.NodeIDTypeString:
		ident = "s=" + nid.StringID()
		if strings.TrimSpace(nid.StringID()) != nid.StringID() {
			return nid.String(), "cannot be bound: its string identifier begins or ends with white space, which a binding's node id trims"
		}
	case ua.NodeIDTypeGUID:
		ident = "g=" + nid.StringID()
	case ua.NodeIDTypeByteString:
		ident = "b=" + nid.StringID()
	default:
		ident = fmt.Sprintf("i=%d", nid.IntID())
	}
	if ns == 0 {
		if strings.Contains(ident, ";") {
			return ident, "cannot be bound: a ';' in a namespace 0 string identifier"
		}
		return ident, ""
	}
	if int(ns) >= len(s.rep.Namespaces) {
		return nid.String(), fmt.Sprintf("namespace index %d is not in the server's namespace table: written as an index", ns)
	}
	uri := s.rep.Namespaces[ns]
	if strings.Contains(uri, ";") || strings.Contains(ident, ";") {
		return nid.String(), fmt.Sprintf("written with the namespace index (%s): a ';' in it cannot be written in the nsu= form; the index changes if the server reorders its namespace table", uri)
	}
	return "nsu=" + uri + ";" + ident, ""
}

// sortNodes orders nodes depth first in the server's reference order:
// each folder's nodes together, as the server lists them.
func sortNodes(ns []*node) {
	slices.SortStableFunc(ns, func(a, b *node) int { return slices.Compare(a.sn.order, b.sn.order) })
}
