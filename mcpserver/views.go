package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// What an agent is shown. Two filters apply to every tools/list, tools/call
// and can_do, whichever endpoint or era the request came through (the view
// alone bounds the resources: resources/list, resources/templates/list,
// every resources/read, subscriptions and the updates sent for them):
//
//   - the view (manifest views:, served at /mcp/<view> and over stdio with
//     --view): only the capabilities it selects, local or routed;
//   - the caller's role (with a policy): a do_ tool of this gateway is listed
//     only to a role its policy lets run it. A call of an unlisted do_ is
//     still judged by the policy (permission_insufficient), so a client that
//     cached an older list gets a clear refusal, never a different action.
//
// A view narrows what an agent sees; it is not a grant: the policy still
// decides every do_. Remote tools are listed by view only: their owner's
// policy decides their roles.

// viewHeader carries the endpoint's view from the route to the handlers.
// Every /mcp route sets or deletes it, so a client cannot choose it.
const viewHeader = "Physd-View"

// withView serves h as the endpoint of view (empty: the whole site).
func (s *Server) withView(view string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del(viewHeader)
		if view != "" {
			r.Header.Set(viewHeader, view)
		}
		defer s.trackRequest(r)()
		h.ServeHTTP(w, r)
	})
}

// requestHeader names an HTTP request for the tool handlers, which the SDK
// runs in a context that does not end when the client hangs up: a caller
// that is gone must not be actuated later (a do_ queued behind another on
// the same capability, waiting for an approval or the L1 gate). Every /mcp
// route sets it; a client's value is replaced.
const requestHeader = "Physd-Request"

// trackRequest registers r's context under a fresh id in its header until
// the returned function runs.
func (s *Server) trackRequest(r *http.Request) func() {
	id := rand.Text()
	r.Header.Set(requestHeader, id)
	s.requests.Store(id, r.Context())
	return func() { s.requests.Delete(id) }
}

// withCaller returns ctx ended also when the HTTP request behind extra
// ends (its client hung up). Once a device step began, the node finishes
// it regardless (node/actuator.go): this only ends waiting.
func (s *Server) withCaller(ctx context.Context, extra *mcp.RequestExtra) (context.Context, context.CancelFunc) {
	if extra == nil || extra.Header == nil {
		return ctx, func() {}
	}
	v, ok := s.requests.Load(extra.Header.Get(requestHeader))
	if !ok {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(v.(context.Context), cancel)
	return ctx, func() { stop(); cancel() }
}

// scope is what one request may see.
type scope struct {
	view     *manifest.View // nil: every capability
	families bool           // list family tools instead of their members
	caller   node.Caller
}

func (s *Server) scopeOf(extra *mcp.RequestExtra) scope {
	var sc scope
	if extra != nil && extra.Header != nil {
		// A credential that fails here fails the call itself elsewhere;
		// until then it is listed as what it authenticated to (nothing).
		sc.caller, _ = s.authenticate(extra.Header)
	} else {
		sc.caller = node.Caller{ID: "stdio", Role: s.opts.StdioRole, Transport: "stdio"}
	}
	sc.view = s.viewNamed(s.viewNameOf(extra))
	sc.families = s.opts.Families
	if sc.view != nil && sc.view.Families != nil {
		sc.families = *sc.view.Families
	}
	return sc
}

// viewNameOf is the name of the view of the endpoint a request came
// through: its route's header over HTTP, --view over stdio ("" for the
// whole site).
func (s *Server) viewNameOf(extra *mcp.RequestExtra) string {
	if extra != nil && extra.Header != nil {
		return extra.Header.Get(viewHeader)
	}
	return s.opts.View
}

// viewNamed is the view called name in the manifest in force (nil for ""):
// one a manifest reload removed after a request was routed to its
// endpoint sees nothing, never the whole site.
func (s *Server) viewNamed(name string) *manifest.View {
	if name == "" {
		return nil
	}
	if v := s.n.Manifest().View(name); v != nil {
		return v
	}
	return removedView(name)
}

// removedKind is a capability kind no capability has.
const removedKind = "(view removed by a manifest reload)"

// removedView stands for a view the manifest in force no longer declares:
// it matches nothing.
func removedView(name string) *manifest.View {
	return &manifest.View{Name: name, Kinds: []string{removedKind}}
}

// site maps every tool of the site to its owners with what a view matches
// them on: this gateway's exposed capabilities and every live owner's in
// the mesh catalog (which lists only exposed ones). A request builds it
// once (the catalog is read once, not per tool of a list).
type site map[string][]manifest.ViewSubject

func (s *Server) site() site { return s.siteOf(false) }

// siteOf is site, with this gateway's unexposed capabilities too when all
// is set: they are no tools, but their names are the site's (a document
// shown through a view must not name one outside it either).
func (s *Server) siteOf(all bool) site {
	out := site{}
	m := s.n.Manifest()
	for _, c := range m.Capabilities {
		if !all && !c.Exposed() {
			continue
		}
		out[c.ToolName()] = append(out[c.ToolName()], m.Subject(c))
	}
	if s.opts.Router != nil {
		for _, t := range s.opts.Router.RemoteTools() {
			out[t.Tool] = append(out[t.Tool], manifest.ViewSubject{Device: t.Owner, Site: t.Site, Area: t.Area, Name: manifest.CapabilityName(t.Tool), Kind: t.Kind, Zone: t.Zone, Tags: t.Tags})
		}
	}
	return out
}

// inView lists the owners of tool the scope's view selects (all owners
// without a view); nil when none.
func (sc scope) inView(subjects []manifest.ViewSubject) []string {
	var owners []string
	for _, sub := range subjects {
		if sc.view == nil || sc.view.Match(sub) {
			owners = append(owners, OwnerKey(sub.Site, sub.Device))
		}
	}
	return owners
}

// roleMayRun reports whether the caller's role may run this gateway's do_
// tool: the node asks the guard in force (the policy file's, or the
// manifest-only guard's), the same rule the do_ path applies.
func (s *Server) roleMayRun(sc scope, tool string) bool {
	_, _, ok := s.n.RoleAllows(tool, sc.caller.Role)
	return ok
}

// visible reports whether the scope may see tool, and which owners it may
// route to (nil for can_do and the local-only case). fams are the site's
// families (a family tool is seen where one of its members is).
func (s *Server) visible(sc scope, tool string, fams map[string]*family, idx site) (bool, []string) {
	if tool == "can_do" {
		return true, nil
	}
	if f := fams[tool]; f != nil {
		var owners []string
		for _, m := range f.members {
			if sc.view != nil && !sc.view.Match(m.subject) {
				continue
			}
			if m.local && f.kind == manifest.KindDo && !s.roleMayRun(sc, m.tool) {
				continue
			}
			if !slices.Contains(owners, m.owner) {
				owners = append(owners, m.owner)
			}
		}
		return len(owners) > 0, owners
	}
	subs := idx[tool]
	if len(subs) == 0 {
		return sc.view == nil, nil // not ours to judge; the SDK answers "unknown tool"
	}
	owners := sc.inView(subs)
	if len(owners) == 0 {
		return false, nil
	}
	if strings.HasPrefix(tool, "do_") && slices.Contains(owners, s.n.DeviceID()) && !s.roleMayRun(sc, tool) {
		// The local instance is not for this role; remote owners judge their own.
		owners = slices.DeleteFunc(owners, func(o string) bool { return o == s.n.DeviceID() })
		if len(owners) == 0 {
			return false, nil
		}
	}
	return true, owners
}

// scopeMiddleware applies the view and the role to tools/list and
// tools/call, and the view to resources/list, resources/templates/list and
// subscriptions/listen, in both protocol eras (the SDK routes both through
// its receiving middleware). Each resource's read handler and the
// subscribe handler check the view themselves; scopeNotifications bounds
// the updates sent.
func (s *Server) scopeMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/list":
			res, err := next(ctx, method, req)
			if err != nil {
				return res, err
			}
			lr, ok := res.(*mcp.ListToolsResult)
			if !ok {
				return res, nil
			}
			sc := s.scopeOf(req.GetExtra())
			fams := s.families()
			idx := s.site()
			served := sc.served(fams)
			members := familyOf(served)
			out := *lr
			out.Tools = make([]*mcp.Tool, 0, len(lr.Tools))
			for _, t := range lr.Tools {
				f := fams[t.Name]
				switch {
				case f != nil && (!sc.families || served[t.Name] == nil): // instances served here
					continue
				case f == nil && sc.families && members[t.Name] != "": // an instance its family serves
					continue
				}
				ok, owners := s.visible(sc, t.Name, fams, idx)
				if !ok {
					continue
				}
				switch {
				case f != nil:
					out.Tools = append(out.Tools, narrowFamily(t, f, sc, s.opts.Fleet))
				case s.opts.Fleet && owners != nil:
					cp := *t
					cp.InputSchema = narrowSites(t.InputSchema.(json.RawMessage), owners)
					cp.Description = narrowOwnersText(t.Description, owners)
					out.Tools = append(out.Tools, &cp)
				default:
					out.Tools = append(out.Tools, narrowSource(t, owners, s.n.DeviceID()))
				}
			}
			return &out, nil
		case "resources/list":
			res, err := next(ctx, method, req)
			if err != nil {
				return res, err
			}
			lr, ok := res.(*mcp.ListResourcesResult)
			sc := s.scopeOf(req.GetExtra())
			if !ok || sc.view == nil {
				return res, nil
			}
			out := *lr
			out.Resources = make([]*mcp.Resource, 0, len(lr.Resources))
			for _, r := range lr.Resources {
				if name, isObs := strings.CutPrefix(r.URI, ObsURIPrefix); isObs {
					if c := s.n.Manifest().Capability(name); c != nil && !sc.view.Match(s.n.Manifest().Subject(c)) {
						continue // its resources/read is refused: not listed either
					}
				}
				out.Resources = append(out.Resources, r)
			}
			return &out, nil
		case "resources/templates/list":
			res, err := next(ctx, method, req)
			if err != nil {
				return res, err
			}
			lr, ok := res.(*mcp.ListResourceTemplatesResult)
			sc := s.scopeOf(req.GetExtra())
			if !ok || sc.view == nil {
				return res, nil
			}
			out := *lr
			out.ResourceTemplates = make([]*mcp.ResourceTemplate, 0, len(lr.ResourceTemplates))
			outside := s.outsideNames(sc)
			for _, t := range lr.ResourceTemplates {
				cp := *t
				cp.Title, cp.Description = scrubNames(t.Title, outside), scrubNames(t.Description, outside)
				out.ResourceTemplates = append(out.ResourceTemplates, &cp)
			}
			return &out, nil
		case "subscriptions/listen":
			// The SDK subscribes each URI without the request's headers,
			// so the view is checked here, where the request still has
			// them: a subscription outside the view is refused with the
			// error its resources/read gets, and nothing is subscribed.
			if p, ok := req.GetParams().(*mcp.SubscriptionsListenParams); ok && p != nil && p.Notifications != nil {
				for _, uri := range p.Notifications.ResourceSubscriptions {
					if err := s.subscriptionInView(req.GetExtra(), uri); err != nil {
						return nil, err
					}
				}
			}
			// The subscribe handler judges each URI again, with this
			// request's scope (the SDK passes it this context, not the
			// request's headers).
			ctx = context.WithValue(ctx, listenExtraKey{}, req.GetExtra())
		case "tools/call":
			var cancel context.CancelFunc
			ctx, cancel = s.withCaller(ctx, req.GetExtra())
			defer cancel()
			p, ok := req.GetParams().(*mcp.CallToolParamsRaw)
			if !ok || p == nil {
				break
			}
			sc := s.scopeOf(req.GetExtra())
			if err := s.notExposed(sc, p); err != nil {
				return toolError(err), nil
			}
			if sc.view == nil {
				break
			}
			fams := s.families()
			ok, owners := s.visible(sc, p.Name, fams, s.site())
			if fams[p.Name] != nil {
				owners = nil // the family handler picks within the view
			}
			if !ok && slices.Equal(sc.view.Kinds, []string{removedKind}) {
				return toolError(fmt.Errorf("the view %q of this endpoint was removed by a manifest reload; nothing was called: connect to an endpoint the manifest declares (/mcp, or /mcp/<view> for one of: %s)", sc.view.Name, strings.Join(s.n.Manifest().ViewNames(), ", "))), nil
			}
			if !ok {
				return toolError(fmt.Errorf("%s is not in the view %q of this endpoint; call it through an endpoint whose view includes it, or use can_do to find what this view offers", p.Name, sc.view.Name)), nil
			}
			if owners != nil && s.opts.Fleet {
				if _, err := ownerArgsOf(p.Arguments).pick(owners, true, p.Name); err != nil {
					return toolError(fmt.Errorf("%s: %w (owners in the view %q: %s)", p.Name, err, sc.view.Name, strings.Join(owners, ", "))), nil
				}
			} else if owners != nil {
				var in struct {
					Source string `json:"source"`
				}
				_ = json.Unmarshal(p.Arguments, &in)
				src := in.Source
				if src == "" {
					src = s.n.DeviceID()
				}
				if !slices.Contains(owners, src) {
					return toolError(&node.InputError{Field: "source", Msg: fmt.Sprintf("%s on %q is not in the view %q; owners in this view: %s", p.Name, src, sc.view.Name, strings.Join(owners, ", "))}), nil
				}
			}
		}
		return next(ctx, method, req)
	}
}

// notExposed refuses a call of this gateway's capability that is not
// exposed (expose: false): it has no tool here, so the SDK would only say
// "unknown tool"; the caller is told why, and nothing is read or moved. A
// call meant for another gateway's tool of the same name (source names it,
// or no source and another owner serves it) is routed as before, and a
// capability outside the endpoint's view is left to the view's refusal,
// which names no more than the view shows.
func (s *Server) notExposed(sc scope, p *mcp.CallToolParamsRaw) error {
	m := s.n.Manifest()
	c := m.Tool(p.Name)
	if c == nil || c.Exposed() || sc.view != nil && !sc.view.Match(m.Subject(c)) {
		return nil
	}
	var in struct {
		Source string `json:"source"`
	}
	_ = json.Unmarshal(p.Arguments, &in)
	switch {
	case in.Source != "" && in.Source != s.n.DeviceID():
		return nil // another gateway's
	case in.Source == "" && len(s.site()[p.Name]) > 0:
		return nil // another gateway serves the tool: the call routes there
	}
	return node.NotExposed(p.Name)
}

// narrowSource returns t with its source argument limited to owners (when
// the tool has one and the scope hides some owners).
func narrowSource(t *mcp.Tool, owners []string, self string) *mcp.Tool {
	raw, ok := t.InputSchema.(json.RawMessage)
	if !ok || owners == nil {
		return t
	}
	var schema map[string]any
	if json.Unmarshal(raw, &schema) != nil {
		return t
	}
	props, _ := schema["properties"].(map[string]any)
	src, _ := props["source"].(map[string]any)
	if src == nil {
		return t
	}
	enum, hasEnum := src["enum"].([]any)
	if !hasEnum {
		if slices.Contains(owners, self) && len(owners) == 1 {
			return t // a local tool whose only owner in scope is this gateway
		}
		enum = nil
	}
	var keep []any
	for _, o := range owners {
		keep = append(keep, o)
	}
	if hasEnum && len(keep) == len(enum) {
		return t
	}
	src = maps.Clone(src)
	src["enum"] = keep
	props = maps.Clone(props)
	props["source"] = src
	schema["properties"] = props
	b, _ := json.Marshal(schema)
	cp := *t
	cp.InputSchema = json.RawMessage(b)
	return &cp
}

// narrowOwnersText names only owners in a remote tool's description,
// which begins with every owner (remoteToolDef: "On <owners> (…"): a
// view names no site or gateway outside it, in words either.
func narrowOwnersText(desc string, owners []string) string {
	rest, ok := strings.CutPrefix(desc, "On ")
	i := strings.Index(rest, " (")
	if !ok || i < 0 {
		return desc
	}
	return "On " + strings.Join(owners, ", ") + rest[i:]
}

// narrowFamily returns a family tool with its zone and source enums
// limited to the members the scope's view selects.
func narrowFamily(t *mcp.Tool, f *family, sc scope, fleet bool) *mcp.Tool {
	if sc.view == nil {
		return t
	}
	if fleet {
		// At the fleet endpoint the description and the schema's per
		// member rules name every member's site and gateway: the tool is
		// typed again from the members the view selects, as if they were
		// the fleet's only ones.
		in := family{tool: f.tool, kind: f.kind}
		for _, m := range f.members {
			if sc.view.Match(m.subject) {
				in.members = append(in.members, m)
			}
		}
		if len(in.members) == 0 || len(in.members) == len(f.members) {
			return t
		}
		return familyToolDef(&in, true, true)
	}
	var zones, owners []any
	var keys []string
	for _, m := range f.members {
		if !sc.view.Match(m.subject) {
			continue
		}
		if !slices.Contains(zones, any(m.zone)) {
			zones = append(zones, m.zone)
		}
		if !slices.Contains(owners, any(m.owner)) {
			owners = append(owners, m.owner)
			keys = append(keys, m.owner)
		}
	}
	raw, ok := t.InputSchema.(json.RawMessage)
	var schema map[string]any
	if !ok || json.Unmarshal(raw, &schema) != nil {
		return t
	}
	props, _ := schema["properties"].(map[string]any)
	if props = maps.Clone(props); props == nil {
		props = map[string]any{}
	}
	for prop, keep := range map[string][]any{"zone": zones, "source": owners} {
		if p, ok := props[prop].(map[string]any); ok {
			p = maps.Clone(p)
			p["enum"] = keep
			props[prop] = p
		}
	}
	if fleet {
		setOwnerEnums(props, keys)
	}
	schema["properties"] = props
	b, _ := json.Marshal(schema)
	cp := *t
	cp.InputSchema = json.RawMessage(b)
	return &cp
}

// askInView is whom a can_do through the request's view may ask: the
// owners of a tool the view selects (nil without a view).
func (s *Server) askInView(extra *mcp.RequestExtra) node.InViewFunc {
	sc := s.scopeOf(extra)
	if sc.view == nil {
		return nil
	}
	idx := s.site()
	return func(site, device, tool string) bool {
		return slices.Contains(sc.inView(idx[tool]), OwnerKey(site, device))
	}
}

// scopeReport removes from a can_do report what the request's view does
// not select, and says so in the metadata: candidates always name a tool
// the caller can call through this endpoint.
func (s *Server) scopeReport(sc scope, req promcp.CanDoRequest, rep *promcp.CapabilityReport) {
	if sc.families {
		defer s.nameFamilies(sc, rep)
	}
	if sc.view == nil {
		return
	}
	idx := s.site()
	in := func(tool, owner string) bool { return slices.Contains(sc.inView(idx[tool]), owner) }
	// Candidates and blocked entries name their owner's site at the fleet
	// endpoint (OwnerKey).
	filtered := 0
	rep.Candidates = slices.DeleteFunc(rep.Candidates, func(c promcp.Candidate) bool {
		out := !in(c.Capability, OwnerKey(c.Site, c.Source))
		if out {
			filtered++
		}
		return out
	})
	rep.Blocked = slices.DeleteFunc(rep.Blocked, func(b promcp.Blocked) bool {
		out := !in(b.Capability, OwnerKey(b.Site, b.Source))
		if out {
			filtered++
		}
		return out
	})
	rep.Context.RelatedReads = slices.DeleteFunc(rep.Context.RelatedReads, func(tool string) bool {
		return len(sc.inView(idx[tool])) == 0
	})
	for name, st := range rep.Context.CurrentObservations {
		src := st.Source
		if src == "" {
			src = s.n.DeviceID()
		}
		if !in("read_"+name, src) && !in("do_"+name, src) { // keyed by capability name
			delete(rep.Context.CurrentObservations, name)
		}
	}
	// unroutable explains what matched: only with what the view shows.
	for i := range rep.Unroutable {
		u := &rep.Unroutable[i]
		kept := u.ProducersFound[:0]
		for _, tool := range u.ProducersFound {
			if len(sc.inView(idx[tool])) > 0 {
				kept = append(kept, tool)
			} else {
				filtered++
			}
		}
		if len(kept) < len(u.ProducersFound) {
			// The requirements named described producers outside the view.
			u.MissingRequirements = nil
			u.Detail = fmt.Sprintf("capabilities outside the view %q matched; ask through an endpoint whose view includes them", sc.view.Name)
		}
		u.ProducersFound = kept
	}
	rep.Metadata.View = sc.view.Name
	rep.Metadata.FilteredByView = filtered
	rep.DeriveFeasible()
	if !rep.Feasible && len(rep.Blocked) == 0 && len(rep.Unroutable) == 0 {
		detail := "nothing in this view matches"
		if filtered > 0 {
			detail = fmt.Sprintf("%d capabilities outside the view %q matched; ask through an endpoint whose view includes them", filtered, sc.view.Name)
		}
		intent := req.Intent
		if intent == nil {
			intent = req.Query
		}
		outcome := ""
		if intent != nil {
			outcome = strings.TrimSpace(intent.Action + " " + intent.Target + " [" + strings.Join(intent.SemanticTags, ",") + "]")
		}
		rep.Unroutable = append(rep.Unroutable, promcp.Unroutable{Outcome: outcome, Reason: promcp.UnroutableNoProducer, Detail: detail})
	}
}

// nameFamilies makes can_do name the family tool where the endpoint lists
// families: the candidate's zone and source are the arguments that pick it.
func (s *Server) nameFamilies(sc scope, rep *promcp.CapabilityReport) {
	of := familyOf(sc.served(s.families()))
	name := func(tool string) string {
		if f := of[tool]; f != "" {
			return f
		}
		return tool
	}
	for i := range rep.Candidates {
		rep.Candidates[i].Capability = name(rep.Candidates[i].Capability)
	}
	for i := range rep.Blocked {
		rep.Blocked[i].Capability = name(rep.Blocked[i].Capability)
	}
	for i, t := range rep.Context.RelatedReads {
		rep.Context.RelatedReads[i] = name(t)
	}
	seen := map[string]bool{}
	rep.Context.RelatedReads = slices.DeleteFunc(rep.Context.RelatedReads, func(t string) bool {
		dup := seen[t]
		seen[t] = true
		return dup
	})
}

// subscriptionInView refuses a subscription to an observation resource
// outside the view of the endpoint the request came through.
func (s *Server) subscriptionInView(extra *mcp.RequestExtra, uri string) error {
	name, isObs := strings.CutPrefix(uri, ObsURIPrefix)
	if !isObs {
		return nil // the subscribe handler judges every other URI
	}
	if c := s.n.Manifest().Capability(name); c != nil && !s.inView(extra, c) {
		return s.notInView(extra, uri)
	}
	return nil
}

// ViewsURI is the resource listing the manifest's views and where each is
// served.
const ViewsURI = "physmcp://views"

// addViewsResource lists the views (what each selects, its endpoint, and
// the tools it lists for this resource's caller).
func (s *Server) addViewsResource() {
	m := s.n.Manifest()
	if len(m.Views) == 0 {
		return
	}
	s.mcp.AddResource(&mcp.Resource{
		URI: ViewsURI, Name: "views", Title: "Views of this site",
		Description: "The named cuts of the site's capabilities: each view's selectors, its HTTP endpoint (/mcp/<view>) and stdio flag (--view), and the capabilities of this gateway it selects.",
		MIMEType:    "application/json",
	}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		// Through a view, only that view: the others would name
		// capabilities outside it.
		m := s.n.Manifest()
		sc := s.scopeOf(req.Extra)
		type entry struct {
			*manifest.View
			Endpoint  string   `json:"endpoint"`
			Stdio     string   `json:"stdio"`
			LocalCaps []string `json:"local_capabilities"`
			// Observed are the view's capabilities here that are not
			// exposed: no tools, their observations in the resources.
			Observed []string `json:"observed_only,omitempty"`
		}
		out := []entry{}
		for _, v := range m.Views {
			if sc.view != nil && v.Name != sc.view.Name {
				continue
			}
			e := entry{View: s.shownView(v), Endpoint: "/mcp/" + v.Name, Stdio: "--view " + v.Name, LocalCaps: []string{}}
			for _, c := range m.Capabilities {
				switch {
				case !v.Match(m.Subject(c)):
				case c.Exposed():
					e.LocalCaps = append(e.LocalCaps, c.ToolName())
				default:
					e.Observed = append(e.Observed, c.Name)
				}
			}
			out = append(out, e)
		}
		return jsonResource(ViewsURI, map[string]any{"views": out})
	})
}

// served is the families the scope lists as family tools: those with two or
// more members in its view (a family with one member in view is served as
// that member's own tool).
func (sc scope) served(fams map[string]*family) map[string]*family {
	if sc.view == nil {
		return fams
	}
	out := map[string]*family{}
	for name, f := range fams {
		n := 0
		for _, m := range f.members {
			if sc.view.Match(m.subject) {
				n++
			}
		}
		if n >= 2 {
			out[name] = f
		}
	}
	return out
}

// shownView is v as its own endpoint shows it: a capabilities: selector
// names only capabilities v selects (a name it lists that another of its
// selectors excludes is outside the view).
func (s *Server) shownView(v *manifest.View) *manifest.View {
	if v == nil || len(v.Capability) == 0 {
		return v
	}
	in := s.namesInView(scope{view: v})
	cp := *v
	cp.Capability = slices.DeleteFunc(slices.Clone(v.Capability), func(name string) bool { return !in[name] })
	return &cp
}

// namesInView maps the names of the site's capabilities (local and
// routed, without read_/do_) to whether the scope's view selects one of
// their owners.
func (s *Server) namesInView(sc scope) map[string]bool {
	out := map[string]bool{}
	for tool, subs := range s.siteOf(true) {
		name := manifest.CapabilityName(tool)
		out[name] = out[name] || len(sc.inView(subs)) > 0
	}
	return out
}

// outsideNames lists the names of the site's capabilities the scope's
// view selects no owner of.
func (s *Server) outsideNames(sc scope) []string {
	var out []string
	for name, in := range s.namesInView(sc) {
		if !in {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// scrubNames replaces in text every whole-word mention of one of names
// (a capability, or its read_/do_ tool) by a placeholder: a document
// shown through a view names nothing outside it.
func scrubNames(text string, names []string) string {
	if len(names) == 0 {
		return text
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = regexp.QuoteMeta(n)
	}
	// \b: a name is a whole word when no letter, digit or _ touches it.
	re := regexp.MustCompile(`\b(?:read_|do_)?(?:` + strings.Join(quoted, "|") + `)\b`)
	return re.ReplaceAllStringFunc(text, func(m string) string {
		if strings.HasPrefix(m, "read_") || strings.HasPrefix(m, "do_") {
			for _, n := range names {
				if m == n { // a capability whose own name starts so
					return "<capability>"
				}
			}
			return "<tool>"
		}
		return "<capability>"
	})
}

// listenExtraKey carries a subscriptions/listen request's RequestExtra (its
// headers: the endpoint's view) to the subscribe handler, which the SDK
// calls for each URI of the listen without it.
type listenExtraKey struct{}

// Who is told of an update. The SDK keeps one subscription table for the
// whole server and sends notifications/resources/updated to every session
// subscribed to the URI, whatever endpoint the session came through. So
// the sender checks each notification against the view of the endpoint
// the session subscribed through, read from the manifest in force when
// the update is sent: a subscription a reload moved out of its view, or
// one that got past the subscribe checks, is never told anything outside
// it, and a session whose subscription was not seen is told nothing.

// subscribers are the sessions that subscribed, with their view.
type subscribers struct {
	s  *Server
	mu sync.Mutex
	by map[*mcp.ServerSession]*subscriber
}

// mixedViews is the view name of a session that subscribed through
// endpoints of different views: no view has it, so it is told nothing.
const mixedViews = "(subscribed through more than one view)"

type subscriber struct {
	view    string // the view's name; "" the whole site
	pending int    // subscriptions/listen and resources/subscribe requests in progress
	legacy  bool   // a resources/subscribe succeeded: kept until the session ends
	alarms  string // the view's active alarms as last told (alarmsSeen)
}

// scopeNotifications installs the receiving middleware that records which
// view each subscribing session sees and the sending middleware that cuts
// notifications/resources/updated to it.
func (s *Server) scopeNotifications() {
	subs := &subscribers{s: s, by: map[*mcp.ServerSession]*subscriber{}}
	s.mcp.AddReceivingMiddleware(subs.record)
	s.mcp.AddSendingMiddleware(subs.filter)
}

func (subs *subscribers) record(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		var alarms bool
		switch p := req.GetParams().(type) {
		case *mcp.SubscribeParams:
			alarms = p != nil && p.URI == AlarmsURI
		case *mcp.SubscriptionsListenParams:
			alarms = p != nil && p.Notifications != nil && slices.Contains(p.Notifications.ResourceSubscriptions, AlarmsURI)
		default:
			return next(ctx, method, req)
		}
		sess, ok := req.GetSession().(*mcp.ServerSession)
		if !ok {
			return next(ctx, method, req)
		}
		view := subs.s.viewNameOf(req.GetExtra())
		var seen string
		if alarms {
			seen = subs.s.alarmsSeen(subs.s.viewNamed(view))
		}
		subs.mu.Lock()
		sub := subs.by[sess]
		switch {
		case sub == nil:
			sub = &subscriber{view: view}
			subs.by[sess] = sub
		case sub.view != view:
			// One session through two endpoints (physd's HTTP sessions
			// are one request each): told nothing rather than guessed.
			sub.view = mixedViews
		}
		if alarms {
			sub.alarms = seen
		}
		sub.pending++
		subs.mu.Unlock()
		res, err := next(ctx, method, req) // a listen returns when it ends
		subs.mu.Lock()
		defer subs.mu.Unlock()
		sub.pending--
		if method == "resources/subscribe" && err == nil && !sub.legacy {
			sub.legacy = true
			go func() {
				_ = sess.Wait()
				subs.mu.Lock()
				defer subs.mu.Unlock()
				sub.legacy = false
				subs.forget(sess, sub)
			}()
		}
		subs.forget(sess, sub)
		return res, err
	}
}

// forget drops sub when nothing keeps it; subs.mu is held.
func (subs *subscribers) forget(sess *mcp.ServerSession, sub *subscriber) {
	if sub.pending == 0 && !sub.legacy && subs.by[sess] == sub {
		delete(subs.by, sess)
	}
}

func (subs *subscribers) filter(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "notifications/resources/updated" {
			return next(ctx, method, req)
		}
		p, _ := req.GetParams().(*mcp.ResourceUpdatedNotificationParams)
		sess, _ := req.GetSession().(*mcp.ServerSession)
		if p == nil || sess == nil || !subs.mayTell(sess, p.URI) {
			return nil, nil // not sent
		}
		return next(ctx, method, req)
	}
}

// mayTell reports whether sess may be told that uri changed.
func (subs *subscribers) mayTell(sess *mcp.ServerSession, uri string) bool {
	subs.mu.Lock()
	sub := subs.by[sess]
	var name string
	if sub != nil {
		name = sub.view
	}
	subs.mu.Unlock()
	if sub == nil {
		return false
	}
	v := subs.s.viewNamed(name)
	if v == nil {
		return true
	}
	m := subs.s.n.Manifest()
	if c, isObs := strings.CutPrefix(uri, ObsURIPrefix); isObs {
		cp := m.Capability(c)
		return cp != nil && v.Match(m.Subject(cp))
	}
	if uri == AlarmsURI {
		// The resource is in every view, its content cut to it: an alarm
		// outside the view changes nothing this session can read.
		seen := subs.s.alarmsSeen(v)
		subs.mu.Lock()
		defer subs.mu.Unlock()
		changed := seen != sub.alarms
		sub.alarms = seen
		return changed
	}
	return false
}
