// Package mcpserver exposes a node as MCP: one read_<cap> tool per
// observation, one do_<cap> per actuation and a single can_do, with proMCP
// output schemas, the manifest as a resource, and the transports (stateless
// Streamable HTTP endpoints, which package web mounts behind physd's
// Origin, Host and auth boundary, and stdio). It is wiring only: every
// decision is the node's; it serves no HTTP route of its own.
package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// Version is set by the build (cmd/physd).
var Version = "dev"

// Instructions teach an agent the proMCP orchestration pattern.
const Instructions = `physd serves physical capabilities of one site (sensors and actuators) as proMCP tools.
Work in four steps:
1. PLAN: call can_do with an intent {semantic_tags, action, target, value, location}. Pick an allowed candidate with confidence >= 0.7 and note its valid_until. Confidence below 0.7, an empty candidate list, or permission requires_human_approval: ask a human instead of acting.
2. OBSERVE: call the read_* tools in context.related_reads (in parallel). quality error: stop. quality degraded: ask a human. quality stale: act with caution.
3. EXECUTE: before valid_until, call the do_* tool with a fresh idempotency_key (a new UUID per operation; reuse it only to retry that same operation). The answer's status is one of three: success = applied and verified by reading the device back; failed = certainly nothing was applied (read reason, permission and code); partial = the write may have landed (verified false, code outcome_unknown, unverified or mismatch): read the matching read_* tool before anything else, and never send the operation again with a new key before you have looked. A tool error on a do_* call changed nothing unless its text says the outcome is unknown.
4. VERIFY: call the read_* tools again to see the effect. Heating and ventilation act over minutes; valves take seconds to travel.
A do_* answered failed with code approval_pending needs a person other than you: tell your human the approval_id from details; once it is approved, repeat the same call with the same idempotency_key. Never try to approve it yourself.
To undo a successful do_*, apply its compensation_hint (for example "do_heater_zone_a value=0").`

var (
	yes = true
	no  = false
)

// toolSet builds the MCP tool definitions and handlers for a node.
type toolSet struct {
	n         *node.Node
	stdioRole string
	metrics   *metrics.Metrics // nil: not measured
	routing   *routing         // nil: no mesh
	sourceArg bool             // local tools take an optional source (mesh)
	fleet     bool             // the fleet endpoint: owners are sites and devices (owners.go)
	authn     func(h http.Header) (node.Caller, error)
	// askInView is whom a can_do through the request's view may ask
	// (views.go; nil: everyone).
	askInView func(extra *mcp.RequestExtra) node.InViewFunc
	// scopeReport narrows a can_do report to the request's view (views.go).
	scopeReport func(extra *mcp.RequestExtra, in promcp.CanDoRequest, rep *promcp.CapabilityReport)

	localMu sync.Mutex
	local   map[string][]byte // listed local tools: their definitions as sent
}

// raw pre-serialises a schema. The SDK re-marshals every tool's input
// schema on each HTTP request (to look for x-mcp-header annotations); a
// json.RawMessage makes that a copy instead of a sorted map encoding.
func raw(s promcp.Schema) json.RawMessage {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // the schemas are static Go values
	}
	return b
}

func (ts *toolSet) register(s *mcp.Server) {
	ts.syncLocal(s)
	s.AddTool(canDoTool(), ts.handleCanDo)
}

// syncLocal lists the manifest's exposed capabilities as tools: a tool
// whose definition changed is re-added, a removed (or no longer exposed)
// one removed (the SDK tells connected clients).
func (ts *toolSet) syncLocal(s *mcp.Server) {
	m := ts.n.Manifest()
	caps := m.ExposedCapabilities() // the others are observed, not tools
	sort.Slice(caps, func(i, j int) bool { return caps[i].ToolName() < caps[j].ToolName() })
	ts.localMu.Lock()
	defer ts.localMu.Unlock()
	if ts.local == nil {
		ts.local = map[string][]byte{}
	}
	want := map[string]bool{}
	for _, c := range caps {
		want[c.ToolName()] = true
	}
	for name := range ts.local {
		if !want[name] {
			s.RemoveTools(name)
			delete(ts.local, name)
		}
	}
	for _, c := range caps {
		def, h := readTool(c), ts.handleRead(c.ToolName())
		if c.Kind == manifest.KindDo {
			def, h = doTool(c), ts.handleDo(c.ToolName())
		}
		if ts.sourceArg {
			def.InputSchema = withSource(def.InputSchema.(json.RawMessage), nil, false)
		}
		b, _ := json.Marshal(def)
		if bytes.Equal(b, ts.local[def.Name]) {
			continue
		}
		ts.local[def.Name] = b
		s.AddTool(def, h)
	}
}

// localNames are the tools of this node's manifest.
func (ts *toolSet) localNames() map[string]bool {
	ts.localMu.Lock()
	defer ts.localMu.Unlock()
	out := make(map[string]bool, len(ts.local))
	for name := range ts.local {
		out[name] = true
	}
	return out
}

func describeRange(c *manifest.Capability) string {
	var b strings.Builder
	if c.Range != nil {
		fmt.Fprintf(&b, " Range %s to %s", promcp.FormatValue(c.Range.Min), promcp.FormatValue(c.Range.Max))
		if c.Unit != "" {
			b.WriteString(" " + c.Unit)
		}
		b.WriteString(".")
	} else if c.Unit != "" {
		b.WriteString(" Unit: " + c.Unit + ".")
	}
	if len(c.EnumValues) > 0 {
		b.WriteString(" One of: " + strings.Join(c.EnumValues, ", ") + ".")
	}
	return b.String()
}

func readTool(c *manifest.Capability) *mcp.Tool {
	// proMCP D003 flags mutation words in read_ descriptions; the manifest
	// text is the author's, ours stays neutral.
	desc := c.Description + describeRange(c) +
		" Returns {value, unit, timestamp, quality}; act only on quality good. Zone: " + c.Zone + "."
	return &mcp.Tool{
		Name:        c.ToolName(),
		Title:       "Observe " + strings.ReplaceAll(c.Name, "_", " "),
		Description: desc,
		InputSchema: raw(promcp.Schema{
			"type": "object",
			"properties": promcp.Schema{
				"max_age_ms": promcp.Schema{"type": "integer", "minimum": 0, "maximum": 86400000,
					"description": "Oldest cached value you accept, in ms; 0 asks the device now. Default: the capability's cache_ttl_ms."},
			},
			"additionalProperties": false,
		}),
		OutputSchema: raw(promcp.ReadOutputSchema(c.DataType, c.EnumValues)),
		Annotations: &mcp.ToolAnnotations{
			Title: c.Name, ReadOnlyHint: true, DestructiveHint: &no, IdempotentHint: true, OpenWorldHint: &no,
		},
	}
}

func doTool(c *manifest.Capability) *mcp.Tool {
	val := promcp.ValueSchema(c.DataType, c.EnumValues, false)
	if c.Range != nil {
		val["minimum"], val["maximum"] = c.Range.Min, c.Range.Max
	}
	val["description"] = "The value to apply" + unitSuffix(c) + "."
	var b strings.Builder
	b.WriteString(c.Description)
	b.WriteString(describeRange(c))
	if len(c.SideEffects) > 0 {
		b.WriteString(" Side effects: " + strings.Join(c.SideEffects, ", ") + ".")
	}
	b.WriteString(" Call can_do first; pass a new idempotency_key per operation (repeats within 24 h return the recorded result without actuating again).")
	b.WriteString(" The device is read before and after the write: the response carries previous_value, applied_value and a compensation_hint;")
	b.WriteString(" status success = applied and verified, failed = nothing applied, partial = read the device before acting again.")
	props := promcp.Schema{
		"value": val,
		"idempotency_key": promcp.Schema{"type": "string", "minLength": 1, "maxLength": node.MaxKeyLen,
			"description": "A new UUID for each operation; reuse it only when retrying that same operation."},
	}
	if l := c.Lease; l != nil && c.Safe != nil {
		fmt.Fprintf(&b, " Leased: the value holds for hold_s seconds (default %d, at most %d), then the output goes to its safe value %s unless another do_ renews it before lease_expires_at (the answer says when).",
			l.DefaultS, l.MaxS, promcp.FormatValue(c.Safe.Value))
		props["hold_s"] = promcp.Schema{"type": "integer", "minimum": 1, "maximum": l.MaxS,
			"description": fmt.Sprintf("How long the value holds, in seconds (default %d, at most %d); then the output goes to its safe value.", l.DefaultS, l.MaxS)}
	}
	destructive := true
	return &mcp.Tool{
		Name:        c.ToolName(),
		Title:       "Actuate " + strings.ReplaceAll(c.Name, "_", " "),
		Description: b.String(),
		InputSchema: raw(promcp.Schema{
			"type":                 "object",
			"properties":           props,
			"required":             []any{"value", "idempotency_key"},
			"additionalProperties": false,
		}),
		OutputSchema: raw(promcp.DoOutputSchema(c.DataType, c.EnumValues)),
		Annotations: &mcp.ToolAnnotations{
			Title: c.Name, ReadOnlyHint: false, DestructiveHint: &destructive, IdempotentHint: true, OpenWorldHint: &no,
		},
	}
}

func unitSuffix(c *manifest.Capability) string {
	if c.Unit == "" {
		return ""
	}
	return " in " + c.Unit
}

func canDoTool() *mcp.Tool {
	return &mcp.Tool{
		Name:  "can_do",
		Title: "Can this be done?",
		Description: "Check whether an intent is feasible before acting, without side effects. " +
			"Send {\"intent\": {\"semantic_tags\": [...], \"action\": \"increase\", \"target\": \"temperature\", \"location\": \"zone_a\", \"value\": 40}} " +
			"(PhysMCP clients may send \"query\" with \"direction\"). Returns candidates (allowed, or requires_human_approval) ranked by confidence " +
			"with valid_until, blocked capabilities with the reason, unroutable when nothing can produce the outcome, the related read_ tools " +
			"and current observations. feasible is true only when an allowed candidate exists. Do not use it to read values; use read_* tools.",
		InputSchema:  raw(promcp.CanDoInputSchema()),
		OutputSchema: raw(promcp.CanDoOutputSchema()),
		Annotations: &mcp.ToolAnnotations{
			Title: "can_do", ReadOnlyHint: true, DestructiveHint: &no, IdempotentHint: true, OpenWorldHint: &no,
		},
	}
}

// decodeArgs strictly decodes tool arguments: a JSON object, no unknown keys.
func decodeArgs(raw json.RawMessage, out any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) || bytes.Equal(raw, []byte("{}")) {
		return nil // nothing to decode: every field keeps its zero value
	}
	if raw[0] != '{' {
		return &node.InputError{Field: "arguments", Msg: "must be a JSON object"}
	}
	if err := exactKeys(raw, out); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return &node.InputError{Field: "arguments", Msg: cleanJSONError(err)}
	}
	return nil
}

// exactKeys refuses an argument object whose top-level names are not
// exactly the schema's, or that names one twice. encoding/json matches
// names case-insensitively and keeps the last duplicate, so {"value":10,
// "Value":95} would move the plant to 95 while a proxy, an audit reader or
// a filter that reads JSON exactly sees 10: a call whose meaning depends on
// the reader is refused.
func exactKeys(raw json.RawMessage, out any) error {
	known := map[string]bool{}
	t := reflect.TypeOf(out)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			known[name] = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return &node.InputError{Field: "arguments", Msg: "must be a JSON object"}
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return &node.InputError{Field: "arguments", Msg: cleanJSONError(err)}
		}
		key, _ := tok.(string)
		switch {
		case seen[key]:
			return &node.InputError{Field: key, Msg: "is given twice; send each argument once"}
		case !known[key]:
			return &node.InputError{Field: "arguments", Msg: fmt.Sprintf("unknown argument %q (names are exact and case-sensitive); see the tool's inputSchema", key)}
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return &node.InputError{Field: key, Msg: cleanJSONError(err)}
		}
	}
	return nil
}

func cleanJSONError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("%s must be %s, got JSON %s", te.Field, jsonTypeName(te.Type.String()), te.Value)
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "json: unknown field ") {
		return "unknown argument " + strings.TrimPrefix(msg, "json: unknown field ") + "; see the tool's inputSchema"
	}
	return strings.TrimPrefix(msg, "json: ")
}

func jsonTypeName(goType string) string {
	switch {
	case strings.Contains(goType, "int"):
		return "an integer"
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.Contains(goType, "Intent"), strings.HasPrefix(goType, "map"), strings.HasPrefix(goType, "*"):
		return "an object"
	}
	return goType
}

// caller establishes who is calling from the transport. HTTP requests
// were authenticated by the boundary already (package web), which stamped
// the caller on them (caller.go); one without a stamp that verifies is
// refused.
func (ts *toolSet) caller(req *mcp.CallToolRequest) (node.Caller, error) {
	if req.Extra != nil && req.Extra.Header != nil {
		c, err := ts.authn(req.Extra.Header)
		// The owner of a routed call authenticates the caller itself
		// (meshnode): keep the credential the caller presented to forward.
		if scheme, cred, ok := strings.Cut(req.Extra.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
			c.Credential = cred
		}
		return c, err
	}
	return node.Caller{ID: "stdio", Role: ts.stdioRole, Transport: "stdio", Credentials: []string{"stdio"}}, nil
}

func toolError(err error) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
}

// jsonResult returns structured content plus the same JSON as text (the
// MCP backward-compatibility rule for outputSchema).
func jsonResult(body []byte) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: string(body)}},
		StructuredContent: json.RawMessage(body),
	}
}

func (ts *toolSet) handleRead(tool string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if res, routed := ts.routedLocal(ctx, req, manifest.KindRead, tool); routed {
			return res, nil
		}
		var in struct {
			MaxAgeMS *int64 `json:"max_age_ms"`
			Source   string `json:"source"` // this node (routedLocal took the others)
		}
		if err := decodeArgs(req.Params.Arguments, &in); err != nil {
			return toolError(err), nil
		}
		if err := ts.checkSource(in.Source); err != nil {
			return toolError(err), nil
		}
		maxAge := time.Duration(-1)
		if in.MaxAgeMS != nil {
			if *in.MaxAgeMS < 0 {
				return toolError(&node.InputError{Field: "max_age_ms", Msg: "must be ≥ 0"}), nil
			}
			maxAge = time.Duration(min(*in.MaxAgeMS, 86400000)) * time.Millisecond
		}
		start := time.Now()
		o, err := ts.n.Read(ctx, tool, maxAge)
		if err != nil {
			return toolError(err), nil
		}
		if m := ts.metrics; m != nil {
			m.Since("read", start)
			m.ToolCalls.WithLabelValues(tool, string(o.Quality), "").Inc()
			m.CacheLookups.WithLabelValues(map[bool]string{true: "hit", false: "device"}[o.Cached]).Inc()
		}
		body, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		return jsonResult(body), nil
	}
}

func (ts *toolSet) handleDo(tool string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if res, routed := ts.routedLocal(ctx, req, manifest.KindDo, tool); routed {
			return res, nil
		}
		var in struct {
			Value          json.RawMessage `json:"value"`
			IdempotencyKey *string         `json:"idempotency_key"`
			HoldS          *int            `json:"hold_s"`
			Source         string          `json:"source"` // this node (routedLocal took the others)
		}
		if err := decodeArgs(req.Params.Arguments, &in); err != nil {
			return toolError(err), nil
		}
		if err := ts.checkSource(in.Source); err != nil {
			return toolError(err), nil
		}
		key := ""
		if in.IdempotencyKey != nil {
			key = *in.IdempotencyKey
		}
		caller, err := ts.caller(req)
		if err != nil {
			return toolError(err), nil
		}
		dr := node.DoRequest{Tool: tool, Value: in.Value, IdempotencyKey: key, Caller: caller}
		if in.HoldS != nil {
			if *in.HoldS < 1 {
				return toolError(&node.InputError{Field: "hold_s", Msg: fmt.Sprintf("%d: a hold is at least 1 second; leave hold_s out for the default", *in.HoldS)}), nil
			}
			dr.HoldS = *in.HoldS
		}
		switch state := req.Params.RequestState; {
		case approval.IsGrant(state):
			// Another person's grant: the node redeems it against this
			// call and the definition in force.
			dr.Grant = state
		case state != "" || len(req.Params.InputResponses) > 0:
			if ts.approvals() == nil {
				return toolError(errors.New("requestState: this server started no approval round")), nil
			}
			return ts.handleApprovalRetry(ctx, req, dr)
		}
		return ts.runDo(ctx, req, dr, "")
	}
}

// approvals is the node's approval authority (nil: no policy, no rounds).
func (ts *toolSet) approvals() *approval.Authority { return ts.n.Approvals() }

// checkSource refuses a source that is not this node once routing had its
// chance (routedLocal sends a mesh owner's calls there): a call meant for
// another gateway must never move this gateway's actuator.
func (ts *toolSet) checkSource(source string) error {
	if source == "" || source == ts.n.DeviceID() {
		return nil
	}
	if ts.routing == nil {
		return &node.InputError{Field: "source", Msg: fmt.Sprintf("%q is not this gateway (%s), and this gateway has no mesh to reach others; "+
			"omit source or send %q. Nothing was actuated", truncateArg(source), ts.n.DeviceID(), ts.n.DeviceID())}
	}
	return &node.InputError{Field: "source", Msg: fmt.Sprintf("%q owns no such capability in the mesh; owners are listed in the tool's source enum. Nothing was actuated", truncateArg(source))}
}

func truncateArg(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// runDo runs the do pipeline; a call that needs approval becomes an
// approval round when the client can elicit, else the proMCP refusal.
func (ts *toolSet) runDo(ctx context.Context, req *mcp.CallToolRequest, dr node.DoRequest, note string) (*mcp.CallToolResult, error) {
	start := time.Now()
	stop := ts.progress(ctx, req, dr.Tool, start)
	body, err := ts.n.Do(ctx, dr)
	stop()
	ts.observeDo(dr.Tool, start, body, err)
	var ar *node.ApprovalRequired
	if errors.As(err, &ar) {
		// Another person must approve (two-person rule): never ask the
		// caller's own client.
		if ts.approvals() != nil && canElicit(req) && (ar.Approver == nil || ar.Approver.CallerMay) {
			return ts.approvalRound(ar, dr.Caller, note)
		}
		return jsonResult(ar.Body), nil
	}
	if err != nil {
		return toolError(err), nil
	}
	return jsonResult(body), nil
}

func (ts *toolSet) handleCanDo(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var in promcp.CanDoRequest
	if err := decodeArgs(req.Params.Arguments, &in); err != nil {
		return toolError(err), nil
	}
	caller, err := ts.caller(req)
	if err != nil {
		return toolError(err), nil
	}
	start := time.Now()
	if ts.askInView != nil {
		if f := ts.askInView(req.Extra); f != nil {
			// Owners outside the view are not asked: they would be sent
			// the caller's credential and question, and make it wait.
			ctx = node.WithInView(ctx, f)
		}
	}
	rep, err := ts.n.CanDo(ctx, in, caller)
	if err != nil {
		return toolError(err), nil
	}
	if ts.scopeReport != nil {
		ts.scopeReport(req.Extra, in, &rep)
	}
	if m := ts.metrics; m != nil {
		m.Since("can_do", start)
		m.ToolCalls.WithLabelValues("can_do", map[bool]string{true: "feasible", false: "infeasible"}[rep.Feasible], "").Inc()
	}
	body, err := json.Marshal(rep)
	if err != nil {
		return nil, err
	}
	return jsonResult(body), nil
}

// observeDo counts a do_ answer by status, permission and gate decision.
func (ts *toolSet) observeDo(tool string, start time.Time, body []byte, err error) {
	m := ts.metrics
	if m == nil {
		return
	}
	m.Since("do", start)
	var ar *node.ApprovalRequired
	if errors.As(err, &ar) {
		body, err = ar.Body, nil
	}
	if err != nil {
		m.ToolCalls.WithLabelValues(tool, "error", "").Inc()
		return
	}
	var r struct {
		Status     string           `json:"status"`
		Permission string           `json:"permission"`
		Gate       *promcp.GateNote `json:"gate"`
		Applied    any              `json:"applied_value"`
	}
	if json.Unmarshal(body, &r) != nil {
		return
	}
	m.ToolCalls.WithLabelValues(tool, r.Status, r.Permission).Inc()
	if r.Gate != nil {
		m.GateDecisions.WithLabelValues(r.Gate.Layer, r.Gate.Decision).Inc()
	}
	if r.Status == "failed" && r.Permission != "allowed" {
		m.Refusals.WithLabelValues(r.Permission).Inc()
	}
}

// progressEvery is how often a do_ in progress tells a client that asked
// for progress (a progressToken) that it is still under way: valves travel
// and settle for seconds, and an agent should not take silence for a hang
// and retry with a new key.
const progressEvery = time.Second

// progress sends MCP progress notifications for a do_ while it runs, when
// the client gave a progressToken and the transport can carry them (stdio,
// or a stream); the returned function stops them. Progress is the elapsed
// seconds (the total is unknown: the device decides).
func (ts *toolSet) progress(ctx context.Context, req *mcp.CallToolRequest, tool string, start time.Time) func() {
	if req == nil || req.Session == nil || req.Params == nil {
		return func() {}
	}
	token := req.Params.GetProgressToken()
	if token == nil {
		return func() {}
	}
	settle := 0
	for _, c := range ts.n.Manifest().Capabilities {
		if c.ToolName() == tool {
			settle = c.SettleMS
		}
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				elapsed := time.Since(start).Seconds()
				msg := fmt.Sprintf("%s in progress for %.0f s: previous read, write, settle (%d ms), verifying read-back; the answer follows", tool, elapsed, settle)
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: elapsed, Message: msg})
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// DecodeBody strictly decodes a JSON request body of an HTTP route (package
// web) with the rules of tool arguments: one object, names exact and each
// once, no unknown names, nothing after it. A body that two JSON readers
// could read differently (a repeated "decision", a second object) is
// refused rather than guessed.
func DecodeBody(r io.Reader, out any) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return errors.New("the body must be one JSON object")
	}
	if err := exactKeys(b, out); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return errors.New(cleanJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("the body must be one JSON object, with nothing after it")
	}
	return nil
}
