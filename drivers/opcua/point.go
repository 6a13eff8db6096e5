package opcua

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"
	"github.com/physd/physd/drivers"
)

// point is one capability's node on its bus.
type point struct {
	bus  *Bus
	spec *pointSpec
}

var (
	_ drivers.Quantizer = (*point)(nil)
	_ drivers.Spanner   = (*point)(nil)
)

// WriteSpan is the binding's (pointSpec.WriteSpan).
func (p *point) WriteSpan() (string, uint64, uint64, string) { return p.spec.WriteSpan() }

// nodeID is the point's node in the session's namespace table: a nsu=
// node is looked up in the table the server sent at this connect.
func (p *point) nodeID(c *opcua.Client) (*ua.NodeID, error) {
	r := p.spec.node
	if r.nsURI == "" {
		return r.id, nil
	}
	for i, u := range c.Namespaces() {
		if u == r.nsURI {
			return ua.ParseNodeID(fmt.Sprintf("ns=%d;%s", i, r.rest))
		}
	}
	return nil, &statusError{what: p.spec.what(), status: ua.StatusBadNodeIDUnknown,
		detail: fmt.Sprintf("the server has no namespace %q (it has %v)", r.nsURI, c.Namespaces())}
}

func (p *point) indexRange() string {
	if p.spec.index < 0 {
		return ""
	}
	return strconv.Itoa(p.spec.index)
}

// Read reads the node's Value attribute. A Good status is a reading; an
// Uncertain one a reading the node serves as degraded, with the code
// name; a Bad one an error carrying the code name.
func (p *point) Read(ctx context.Context) (drivers.Reading, error) {
	c, gen, err := p.bus.session(ctx)
	if err != nil {
		return drivers.Reading{}, err
	}
	id, err := p.nodeID(c)
	if err != nil {
		return drivers.Reading{}, err
	}
	rctx, cancel := p.bus.call(ctx)
	defer cancel()
	res, err := c.Read(rctx, &ua.ReadRequest{
		NodesToRead:        []*ua.ReadValueID{{NodeID: id, AttributeID: ua.AttributeIDValue, IndexRange: p.indexRange()}},
		TimestampsToReturn: ua.TimestampsToReturnNeither,
	})
	if err != nil {
		return drivers.Reading{}, p.serviceErr(c, gen, "read", err)
	}
	if len(res.Results) != 1 {
		return drivers.Reading{}, fmt.Errorf("opcua %s: read %s: %d results for one node", p.bus.spec.name, p.spec.what(), len(res.Results))
	}
	dv := res.Results[0]
	st := dv.Status
	if isBad(st) {
		return drivers.Reading{}, &statusError{what: p.spec.what(), status: st}
	}
	v, err := p.decode(dv.Value)
	if err != nil {
		return drivers.Reading{}, err
	}
	// At is when physd read the value, not the server's SourceTimestamp:
	// that says when the value last changed (an untouched setpoint's is
	// hours old, yet the value is current), and the server's clock may be
	// off; the node's cache and stale rules count from the read.
	r := drivers.Reading{Value: v, At: time.Now()}
	if isUncertain(st) {
		r.Uncertain = "OPC UA status " + statusName(st)
	}
	return r, nil
}

// Write writes v to the node's Value attribute. A numeric value outside
// the node's EURange (when it has one) is refused before anything is
// sent; a Bad status in the reply means the server applied nothing.
func (p *point) Write(ctx context.Context, v any) error {
	if !p.spec.writable {
		return fmt.Errorf("opcua %s: %s: %w", p.bus.spec.name, p.spec.what(), drivers.ErrReadOnly)
	}
	variant, f, err := p.encode(v)
	if err != nil {
		return err
	}
	c, gen, err := p.bus.writeSession(ctx)
	if err != nil {
		return err
	}
	id, err := p.nodeID(c)
	if err != nil {
		return notSent(err)
	}
	if p.spec.typ.class != "bool" && p.spec.typ.class != "string" {
		if err := p.checkEURange(ctx, c, gen, id, f); err != nil {
			return err
		}
	}
	wctx, cancel := p.bus.call(ctx)
	defer cancel()
	res, err := c.Write(wctx, &ua.WriteRequest{NodesToWrite: []*ua.WriteValue{{
		NodeID:      id,
		AttributeID: ua.AttributeIDValue,
		IndexRange:  p.indexRange(),
		Value:       &ua.DataValue{EncodingMask: ua.DataValueValue, Value: variant},
	}}})
	if err != nil {
		var st ua.StatusCode
		if errors.As(err, &st) && refusedWhole(st) {
			// A ServiceFault: the server executed nothing.
			p.bus.answered(c, gen, err)
			return &statusError{what: p.spec.what(), status: st, write: true}
		}
		// The request may have reached the server: the node reads back.
		p.bus.drop(gen, err)
		return fmt.Errorf("opcua %s: write %s: no reply (%v); the write may have been applied", p.bus.spec.name, p.spec.what(), err)
	}
	if len(res.Results) != 1 {
		return fmt.Errorf("opcua %s: write %s: %d results for one node", p.bus.spec.name, p.spec.what(), len(res.Results))
	}
	// Only a Bad result means the server applied nothing. A Good one with
	// a sub-code (GoodClamped: it applied a value of its own;
	// GoodCompletesAsynchronously: it applies it later) is a write the
	// server took, and an Uncertain one may have been applied: the node's
	// read-back says what the node holds.
	if st := res.Results[0]; st != ua.StatusOK && !isGood(st) {
		return &statusError{what: p.spec.what(), status: st, write: true}
	}
	return nil
}

// checkEURange reads the node's EURange property, if it has one, and
// refuses f outside it. The property is looked up on each write: a server
// may change it, and an old range must not let a value through.
func (p *point) checkEURange(ctx context.Context, c *opcua.Client, gen uint64, id *ua.NodeID, f float64) error {
	ctx, cancel := p.bus.call(ctx)
	defer cancel()
	rid, err := p.euRangeNode(ctx, c, id)
	if err != nil {
		var st ua.StatusCode
		if !errors.As(err, &st) {
			return notSent(err)
		}
		return notSent(p.serviceErr(c, gen, "look up the EURange of", err))
	}
	if rid == nil {
		return nil // no EURange: nothing to check
	}
	rr, err := c.Read(ctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: rid, AttributeID: ua.AttributeIDValue}}})
	if err != nil {
		return notSent(p.serviceErr(c, gen, "read the EURange of", err))
	}
	if len(rr.Results) != 1 || rr.Results[0].Status != ua.StatusOK || rr.Results[0].Value == nil {
		st := ua.StatusBadUnexpectedError
		if len(rr.Results) == 1 {
			st = rr.Results[0].Status
		}
		return notSent(&statusError{what: p.spec.what() + " EURange", status: st})
	}
	eo, ok := rr.Results[0].Value.Value().(*ua.ExtensionObject)
	var rg *ua.Range
	if ok {
		rg, ok = eo.Value.(*ua.Range)
	}
	if !ok || rg == nil {
		return notSent(fmt.Errorf("opcua %s: the EURange of %s is not a Range (%T): refusing to write unchecked", p.bus.spec.name, p.spec.what(), rr.Results[0].Value.Value()))
	}
	if f < rg.Low || f > rg.High || math.IsNaN(f) {
		return &rangeError{what: p.spec.what(), v: f, lo: rg.Low, hi: rg.High}
	}
	return nil
}

// euRangeNode finds the node's EURange property (nil: it has none):
// TranslateBrowsePathsToNodeIds, or, on a server without that service
// (BadServiceUnsupported: gopcua's, small embedded ones), a Browse of the
// node's properties.
func (p *point) euRangeNode(ctx context.Context, c *opcua.Client, id *ua.NodeID) (*ua.NodeID, error) {
	res, err := send[*ua.TranslateBrowsePathsToNodeIDsResponse](ctx, c, &ua.TranslateBrowsePathsToNodeIDsRequest{BrowsePaths: []*ua.BrowsePath{{
		StartingNode: id,
		RelativePath: &ua.RelativePath{Elements: []*ua.RelativePathElement{{
			ReferenceTypeID: ua.NewNumericNodeID(0, hasProperty),
			IncludeSubtypes: true,
			TargetName:      &ua.QualifiedName{NamespaceIndex: 0, Name: "EURange"},
		}}},
	}}})
	if errors.Is(err, ua.StatusBadServiceUnsupported) {
		return p.browseEURange(ctx, c, id)
	}
	if err != nil {
		return nil, err
	}
	if len(res.Results) != 1 {
		return nil, fmt.Errorf("opcua %s: EURange of %s: %d results for one path", p.bus.spec.name, p.spec.what(), len(res.Results))
	}
	br := res.Results[0]
	switch {
	case br.StatusCode == ua.StatusBadNoMatch || (br.StatusCode == ua.StatusOK && len(br.Targets) == 0):
		return nil, nil
	case br.StatusCode != ua.StatusOK:
		return nil, &statusError{what: p.spec.what() + " EURange", status: br.StatusCode}
	}
	return br.Targets[0].TargetID.NodeID, nil
}

// hasProperty is the HasProperty reference type (ns=0;i=46).
const hasProperty = 46

// browseEURange finds the EURange among the node's HasProperty
// references. A node whose properties do not fit one answer is refused:
// its EURange could be among those not seen.
func (p *point) browseEURange(ctx context.Context, c *opcua.Client, id *ua.NodeID) (*ua.NodeID, error) {
	res, err := c.Browse(ctx, &ua.BrowseRequest{NodesToBrowse: []*ua.BrowseDescription{{
		NodeID: id, BrowseDirection: ua.BrowseDirectionForward, ReferenceTypeID: ua.NewNumericNodeID(0, hasProperty),
		IncludeSubtypes: true, ResultMask: uint32(ua.BrowseResultMaskBrowseName),
	}}})
	if err != nil {
		return nil, err
	}
	if len(res.Results) != 1 {
		return nil, fmt.Errorf("opcua %s: the properties of %s: %d results for one node", p.bus.spec.name, p.spec.what(), len(res.Results))
	}
	br := res.Results[0]
	if isBad(br.StatusCode) {
		return nil, &statusError{what: p.spec.what() + " EURange", status: br.StatusCode, op: "browse"}
	}
	for _, ref := range br.References {
		if ref.BrowseName != nil && ref.BrowseName.NamespaceIndex == 0 && ref.BrowseName.Name == "EURange" && ref.NodeID != nil {
			return ref.NodeID.NodeID, nil
		}
	}
	if len(br.ContinuationPoint) > 0 {
		return nil, fmt.Errorf("opcua %s: %s has more properties than the server sends in one Browse answer: refusing to write without knowing its EURange", p.bus.spec.name, p.spec.what())
	}
	return nil, nil
}

// serviceErr is a service call that failed. One that got no usable reply
// (or whose status says the session or channel is gone) drops the
// session, so the next call opens a fresh one (after a server restart the
// old session is gone, and nothing it fetched is served); a request the
// server refused as a whole (BadServiceUnsupported, BadTooManyOperations)
// leaves it.
func (p *point) serviceErr(c *opcua.Client, gen uint64, op string, err error) error {
	p.bus.answered(c, gen, err)
	var st ua.StatusCode
	if errors.As(err, &st) {
		return &statusError{what: p.spec.what(), status: st, op: op}
	}
	return fmt.Errorf("opcua %s: %s %s: %w", p.bus.spec.name, op, p.spec.what(), err)
}

// refusedWhole reports whether st, the error of a service call, is a
// ServiceFault the server answered (it executed nothing), rather than a
// reply that never came or could not be read (gopcua's own timeout is
// BadTimeout; an undecodable reply BadDecodingError), after which the
// request may have been executed.
func refusedWhole(st ua.StatusCode) bool {
	if !isBad(st) {
		return false
	}
	switch st {
	case ua.StatusBadTimeout, ua.StatusBadRequestTimeout, ua.StatusBadDecodingError, ua.StatusBadResponseTooLarge,
		ua.StatusBadCommunicationError, ua.StatusBadConnectionClosed, ua.StatusBadSecureChannelClosed, ua.StatusBadUnexpectedError:
		return false
	}
	return true
}

// Quantize returns the value a Float node holds after v is written; an
// integer outside the node's type is refused.
func (p *point) Quantize(v any) (any, error) {
	_, _, err := p.encode(v)
	if err != nil {
		return nil, err
	}
	if f, ok := v.(float64); ok && p.spec.typ.id == ua.TypeIDFloat {
		return float64(float32(f)), nil
	}
	return v, nil
}

// errNotSent marks an error before the write: nothing was sent.
type errNotSent struct{ err error }

func (e *errNotSent) Error() string   { return e.err.Error() + " (nothing written)" }
func (e *errNotSent) Unwrap() []error { return []error{e.err, drivers.ErrOffline} }

func notSent(err error) error { return &errNotSent{err: err} }
