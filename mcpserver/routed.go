package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// ErrOutcomeUnknown is wrapped by a Router's Do error when the request
// reached the owner and was told to go ahead, but no answer came back: the
// actuation may have happened. The call answers a do_ result with status
// partial, verified false and code outcome_unknown (never a failure).
var ErrOutcomeUnknown = errors.New("outcome unknown")

// RemoteTool is a capability another node of the site owns (at the fleet
// endpoint: a gateway of one of the sites).
type RemoteTool struct {
	Owner string // the owner's device id
	// Site is the owner's fleet site (network.fleet.site); empty in a
	// site mesh (owners.go).
	Site        string
	Tool        string
	Kind        string
	DataType    string
	Unit        string
	Zone        string
	Area        string   // the owner's device.location.area
	Tags        []string // semantic_tags
	Family      string   // the capability's family, if any
	Description string
	EnumValues  []string
	SideEffects []string
	Min, Max    *float64
	// Lease and SafeValue are a leased output's terms on its owner: the
	// routed tool offers hold_s within them.
	Lease     *manifest.Lease
	SafeValue string
}

// RoutedDo is a do_ call sent to the capability's owner.
type RoutedDo struct {
	Tool           string
	Value          json.RawMessage
	IdempotencyKey string
	// Grant is a two-person grant the caller sent (requestState): the
	// owner, which issued it, redeems it.
	Grant string
	// HoldS is the lease the caller asked for (0: the owner's default).
	HoldS  int
	Caller node.Caller
}

// Router reaches the other nodes of the site (the mesh). Each owner
// executes with its own policy and gate.
type Router interface {
	RemoteTools() []RemoteTool // the tools of live members other than this node
	Read(ctx context.Context, owner, tool string, maxAgeMS int64) ([]byte, error)
	Do(ctx context.Context, owner string, d RoutedDo) ([]byte, error)
	OnChange(func())
}

// routing keeps the remote-only tools registered in step with the mesh.
type routing struct {
	ts       *toolSet
	srv      *mcp.Server
	router   Router
	mu       sync.Mutex
	owners   map[string][]string // tool -> owners on other nodes
	listed   map[string]bool     // remote-only tools registered here
	local    map[string]bool
	deviceID string
}

func (ts *toolSet) enableRouting(s *mcp.Server, r Router) {
	rt := &routing{ts: ts, srv: s, router: r, owners: map[string][]string{}, listed: map[string]bool{}, local: ts.localNames(), deviceID: ts.n.DeviceID()}
	ts.routing = rt
	rt.sync()
	r.OnChange(rt.sync)
}

// sync adds tools that appeared in the site and removes those whose owners
// are gone; the SDK tells connected clients (tools/list_changed).
func (rt *routing) sync() {
	byTool := map[string][]RemoteTool{}
	for _, t := range rt.router.RemoteTools() {
		if t.Kind == manifest.KindRead || t.Kind == manifest.KindDo {
			byTool[t.Tool] = append(byTool[t.Tool], t)
		}
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for tool := range rt.owners {
		if _, ok := byTool[tool]; !ok {
			delete(rt.owners, tool)
			if rt.listed[tool] {
				rt.srv.RemoveTools(tool)
				delete(rt.listed, tool)
			}
		}
	}
	for tool, list := range byTool {
		owners := make([]string, 0, len(list))
		for _, t := range list {
			owners = append(owners, t.key())
		}
		sort.Strings(owners)
		if slices.Equal(owners, rt.owners[tool]) {
			continue
		}
		rt.owners[tool] = owners
		if !rt.local[tool] { // a local tool already lists an optional source
			rt.listed[tool] = true
			rt.srv.AddTool(remoteToolDef(list[0], owners, rt.ts.fleet), rt.handle(list[0].Kind, tool))
		}
	}
}

// relistLocal re-lists the local tools after a manifest reload (relist
// does it and returns their names) while no routing sync runs, so a sync
// never lists a remote definition over a local tool or loses one: a
// remote tool no longer shadowed by a local one is listed as routed (the
// local tool listed its optional source; it is gone now).
func (rt *routing) relistLocal(relist func() map[string]bool) {
	byTool := map[string]RemoteTool{}
	for _, t := range rt.router.RemoteTools() {
		if t.Kind == manifest.KindRead || t.Kind == manifest.KindDo {
			byTool[t.Tool] = t
		}
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	local := relist()
	rt.local = local
	for tool, owners := range rt.owners {
		switch {
		case local[tool]:
			delete(rt.listed, tool) // the local definition replaced it
		case !rt.listed[tool]:
			if t, ok := byTool[tool]; ok {
				rt.listed[tool] = true
				rt.srv.AddTool(remoteToolDef(t, owners, rt.ts.fleet), rt.handle(t.Kind, tool))
			}
		}
	}
}

// ownersOf lists the owners of a remote tool (nil when unknown).
func (rt *routing) ownersOf(tool string) []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.owners[tool]
}

func remoteToolDef(t RemoteTool, owners []string, fleet bool) *mcp.Tool {
	c := &manifest.Capability{Name: manifest.CapabilityName(t.Tool), Kind: t.Kind,
		Description: t.Description, DataType: t.DataType, Unit: t.Unit, Zone: t.Zone, EnumValues: t.EnumValues, SideEffects: t.SideEffects}
	if t.Min != nil && t.Max != nil {
		c.Range = &manifest.Range{Min: *t.Min, Max: *t.Max}
	}
	if t.Lease != nil {
		c.Lease, c.Safe = t.Lease, &manifest.Safe{Value: t.SafeValue}
	}
	var def *mcp.Tool
	if t.Kind == manifest.KindRead {
		def = readTool(c)
	} else {
		def = doTool(c)
	}
	if fleet {
		def.Description = "On " + strings.Join(owners, ", ") + " (site/gateway; the fleet endpoint forwards the call and the gateway applies its own policy). " + def.Description
		def.InputSchema = withSite(def.InputSchema.(json.RawMessage), owners)
		return def
	}
	def.Description = "On " + strings.Join(owners, ", ") + " (routed through this gateway; the owner applies its own policy). " + def.Description
	def.InputSchema = withSource(def.InputSchema.(json.RawMessage), owners, true)
	return def
}

// withSource adds the source argument to a tool's input schema: required
// (one of owners) for a remote tool, optional for a local one.
func withSource(schema json.RawMessage, owners []string, required bool) json.RawMessage {
	var s map[string]any
	_ = json.Unmarshal(schema, &s)
	props, _ := s["properties"].(map[string]any)
	src := map[string]any{"type": "string", "maxLength": 128,
		"description": "device id of the node that owns the capability; default: this node"}
	if required {
		enum := make([]any, len(owners))
		for i, o := range owners {
			enum[i] = o
		}
		src["enum"] = enum
		src["description"] = "device id of the node that owns the capability"
		req, _ := s["required"].([]any)
		s["required"] = append(req, "source")
	}
	props["source"] = src
	b, _ := json.Marshal(s)
	return b
}

// handle serves a remote-only tool: the call goes to the named owner.
func (rt *routing) handle(kind, tool string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		a := ownerArgsOf(req.Params.Arguments)
		owner := a.Source
		if rt.ts.fleet {
			var err error
			if owner, err = a.pick(rt.ownersOf(tool), true, tool); err != nil {
				return toolError(err), nil
			}
		}
		return rt.route(ctx, req, kind, tool, owner)
	}
}

// route sends a call to its owner and returns the owner's answer as is.
func (rt *routing) route(ctx context.Context, req *mcp.CallToolRequest, kind, tool, owner string) (*mcp.CallToolResult, error) {
	if owners := rt.ownersOf(tool); !slices.Contains(owners, owner) {
		var msg string
		switch {
		case len(owners) == 0:
			msg = fmt.Sprintf("no gateway of the site offers %s now (its owner removed it in a manifest reload, or left the site); nothing was done: list the tools again", tool)
		case owner == "":
			msg = fmt.Sprintf("required: %s is on another gateway; fix: name its owner, one of %s", tool, strings.Join(owners, ", "))
		default:
			msg = fmt.Sprintf("%q does not offer %s; fix: one of %s", owner, tool, strings.Join(owners, ", "))
		}
		return toolError(&node.InputError{Field: "source", Msg: msg}), nil
	}
	var args struct {
		Site           *string         `json:"site"`
		Source         string          `json:"source"`
		MaxAgeMS       *int64          `json:"max_age_ms"`
		Value          json.RawMessage `json:"value"`
		IdempotencyKey *string         `json:"idempotency_key"`
		HoldS          *int            `json:"hold_s"`
	}
	if err := decodeArgs(req.Params.Arguments, &args); err != nil {
		return toolError(err), nil
	}
	if args.Site != nil && !rt.ts.fleet {
		return toolError(&node.InputError{Field: "arguments", Msg: `unknown argument "site" (a site mesh's owners are named by source); see the tool's inputSchema`}), nil
	}
	var body []byte
	var err error
	if kind == manifest.KindRead {
		maxAge := int64(-1)
		if args.MaxAgeMS != nil {
			maxAge = *args.MaxAgeMS
		}
		body, err = rt.router.Read(ctx, owner, tool, maxAge)
	} else {
		caller, cerr := rt.ts.caller(req)
		if cerr != nil {
			return toolError(cerr), nil
		}
		key := ""
		if args.IdempotencyKey != nil {
			key = *args.IdempotencyKey
		}
		grant := ""
		if approval.IsGrant(req.Params.RequestState) {
			grant = req.Params.RequestState
		}
		hold := 0
		if args.HoldS != nil {
			// The owner checks it against its lease terms; 0 would mean
			// its default, so a 0 the caller sent is refused here.
			if *args.HoldS < 1 {
				return toolError(&node.InputError{Field: "hold_s", Msg: fmt.Sprintf("%d: a hold is at least 1 second; leave hold_s out for the default", *args.HoldS)}), nil
			}
			hold = *args.HoldS
		}
		body, err = rt.router.Do(ctx, owner, RoutedDo{Tool: tool, Value: args.Value, IdempotencyKey: key, Grant: grant, HoldS: hold, Caller: caller})
		if err == nil && !jsonObject(body) {
			// The request reached the owner; its answer says nothing.
			err = fmt.Errorf("%w: %s answered with something that is not a JSON object", ErrOutcomeUnknown, owner)
		}
		if errors.Is(err, ErrOutcomeUnknown) {
			return outcomeUnknown(owner, tool, key, args.Value, err, rt.lookFirst(owner, tool)), nil
		}
	}
	if err == nil && !jsonObject(body) {
		err = fmt.Errorf("%s answered with something that is not a JSON object", owner)
	}
	if err != nil {
		return toolError(fmt.Errorf("%s on %s: %w", tool, owner, err)), nil
	}
	return jsonResult(body), nil
}

// jsonObject reports whether an owner's answer can be a tool's
// structured content: a JSON object. Anything else (a broken or lying
// owner, a body cut on the way) could not be sent, and the caller would
// wait for an answer that never comes.
func jsonObject(b []byte) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(b, &m) == nil && m != nil
}

// routedLocal sends a local tool's call elsewhere when its source
// argument names another node.
func (ts *toolSet) routedLocal(ctx context.Context, req *mcp.CallToolRequest, kind, tool string) (*mcp.CallToolResult, bool) {
	if ts.routing == nil {
		return nil, false
	}
	var in struct {
		Source string `json:"source"`
	}
	if json.Unmarshal(req.Params.Arguments, &in) != nil || in.Source == "" || in.Source == ts.n.DeviceID() {
		return nil, false
	}
	res, _ := ts.routing.route(ctx, req, kind, tool, in.Source)
	return res, true
}

// lookFirst is how an agent sees the owner's device after a routed do_
// whose outcome is unknown, naming a tool the site serves: the owner's
// read_<cap> when it has one, else can_do scoped to the owner, whose
// candidate for the tool carries the device's current value.
func (rt *routing) lookFirst(owner, tool string) string {
	read := "read_" + manifest.CapabilityName(tool)
	var tags []string
	site, device := SplitOwner(owner)
	args := "source " + device
	if site != "" {
		args = "site " + site + " and source " + device
	}
	for _, t := range rt.router.RemoteTools() {
		if t.key() != owner {
			continue
		}
		if t.Tool == read && t.Kind == manifest.KindRead {
			return fmt.Sprintf("Read %s with %s before acting again", read, args)
		}
		if t.Tool == tool {
			tags = t.Tags
		}
	}
	if tags == nil {
		tags = []string{}
	}
	q, _ := json.Marshal(map[string]any{"intent": map[string]any{"semantic_tags": tags}, "scope": []string{device}})
	return fmt.Sprintf("Look before acting again: call can_do with %s; its candidate %s on %s shows the device's current value (current_state)", q, tool, owner)
}

// outcomeUnknown is the do_ answer for a routed actuation whose request
// reached the owner but whose answer did not come back.
func outcomeUnknown(owner, tool, key string, value json.RawMessage, err error, look string) *mcp.CallToolResult {
	var requested any
	_ = json.Unmarshal(value, &requested)
	site, device := SplitOwner(owner)
	r := promcp.DoResult{
		Status: promcp.StatusPartial, IdempotencyKey: key, Timestamp: time.Now().UTC(), SideEffects: []string{},
		Capability: tool, Source: device, Site: site, RequestedValue: requested, Verified: false,
		Permission: promcp.PermSourceUnreachable, Code: promcp.CodeOutcomeUnknown,
		Reason: fmt.Sprintf("%s on %s: the request reached %s and was told to go ahead, but no answer came back (%v): the actuation may have happened. %s; retry only with the same idempotency_key.",
			tool, owner, owner, err, look),
		Details: "code=outcome_unknown; owner=" + owner,
		Policy:  promcp.PolicyNote{Configured: false, Decision: "not_evaluated", Note: "decided on the owner " + owner},
	}
	b, _ := json.Marshal(r)
	return jsonResult(b)
}
