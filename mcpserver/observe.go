package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
)

// ObsURIPrefix names the observation resources: physmcp://obs/<capability>
// holds the capability's current observation (the read_ answer) as JSON,
// and a subscriber is told when it changes beyond the capability's
// deadband (or its quality changes).
const ObsURIPrefix = "physmcp://obs/"

// DefaultObsMinInterval is the least time between two updates of one
// observation resource a subscriber receives: a value that keeps changing
// costs each subscriber at most one notification a second, and the last
// change is always sent (trailing edge).
const DefaultObsMinInterval = time.Second

// addObservationResources registers physmcp://obs/<cap> for every local
// capability and starts the loop that turns the node's observation stream
// into resource-updated notifications. The loop ends when the node closes.
func (s *Server) addObservationResources(minInterval time.Duration) {
	if minInterval <= 0 {
		minInterval = DefaultObsMinInterval
	}
	s.obsMin = minInterval
	s.syncObservationResources()
	lim := &updateLimiter{min: minInterval, pending: map[string]*limitState{}, send: func(uri string) {
		_ = s.mcp.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: uri})
	}}
	// Only the changes of capabilities someone subscribed to matter: the
	// rest never reaches this loop (a plant's thousands of points change
	// every second, and nobody watches most of them).
	sub := s.n.SubscribeWhere(node.DefaultSubscriptionBuffer, func(o node.Observed) bool {
		if !o.Changed || o.Cap == nil {
			return false
		}
		_, watched := s.obsWatched.Load(o.Cap.Name)
		return watched
	})
	go func() {
		defer lim.stop()
		for {
			select {
			case <-sub.Done():
				return
			case o := <-sub.C:
				lim.hit(ObsURIPrefix + o.Cap.Name)
			}
		}
	}()
}

// inView reports whether capability c is in the view of the endpoint the
// request came through (every capability without a view): resources show
// what the endpoint's tools show.
func (s *Server) inView(extra *mcp.RequestExtra, c *manifest.Capability) bool {
	sc := s.scopeOf(extra)
	return sc.view == nil || sc.view.Match(s.n.Manifest().Subject(c))
}

func (s *Server) notInView(extra *mcp.RequestExtra, uri string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("%s is not in the view %q of this endpoint; fix: read it through an endpoint whose view includes it", uri, s.scopeOf(extra).view.Name)}
}

// subscribable checks a subscription request: an observation resource, and
// a stream to send its updates on. A 2025-11-25 resources/subscribe over
// physd's stateless HTTP endpoint has none (the SDK serves that era
// without sessions there): the client is told to listen instead.
//
// The SDK calls it for each URI of a 2026-07-28 subscriptions/listen
// without the request's headers; scopeMiddleware passes them in ctx, so
// the view checked is always the one of the endpoint the request came
// through (never --view's for an HTTP listen).
func (s *Server) subscribable(ctx context.Context, req *mcp.SubscribeRequest) error {
	uri := req.Params.URI
	name, isObs := strings.CutPrefix(uri, ObsURIPrefix)
	known := isObs && s.n.Manifest().Capability(name) != nil || uri == AlarmsURI && (s.opts.Alarms != nil || s.opts.Sites != nil)
	if !known {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("uri: %q is not a subscribable resource; fix: subscribe to %s<capability>, one of the physmcp://obs/ resources resources/list shows (or physmcp://alarms)", uri, ObsURIPrefix)}
	}
	extra := req.Extra
	if listen, ok := ctx.Value(listenExtraKey{}).(*mcp.RequestExtra); ok && extra == nil {
		extra = listen
	}
	if isObs && !s.inView(extra, s.n.Manifest().Capability(name)) {
		return s.notInView(extra, uri) // what cannot be read cannot be subscribed to
	}
	if req.Extra != nil && req.Extra.Header != nil {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "resources/subscribe: physd's HTTP endpoint is stateless and keeps no stream for 2025-11-25 updates; fix: use protocol 2026-07-28 (subscriptions/listen with resourceSubscriptions), or stdio"}
	}
	if isObs {
		// From now on its changes are sent on (the SDK tells the
		// sessions subscribed to it; none once they all left).
		s.obsWatched.Store(name, struct{}{})
	}
	return nil
}

// updateLimiter sends at most one update per URI per min; a change inside
// the interval is sent when it ends (one trailing update), so a subscriber
// always learns of the last change.
type updateLimiter struct {
	min     time.Duration
	send    func(uri string)
	mu      sync.Mutex
	pending map[string]*limitState
	stopped bool
}

type limitState struct {
	last  time.Time
	timer *time.Timer // a trailing update is scheduled
}

func (l *updateLimiter) hit(uri string) {
	l.mu.Lock()
	st := l.pending[uri]
	if st == nil {
		st = &limitState{}
		l.pending[uri] = st
	}
	if st.timer != nil || l.stopped {
		l.mu.Unlock()
		return
	}
	now := time.Now()
	if wait := st.last.Add(l.min).Sub(now); !st.last.IsZero() && wait > 0 {
		st.timer = time.AfterFunc(wait, func() {
			l.mu.Lock()
			st.timer, st.last = nil, time.Now()
			stopped := l.stopped
			l.mu.Unlock()
			if !stopped {
				l.send(uri)
			}
		})
		l.mu.Unlock()
		return
	}
	st.last = now
	l.mu.Unlock()
	l.send(uri)
}

func (l *updateLimiter) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	for _, st := range l.pending {
		if st.timer != nil {
			st.timer.Stop()
			st.timer = nil
		}
	}
}

// liveResource reports whether req reads an observation, history or
// alarms resource, whose answer no cache may keep.
func liveResource(req mcp.Request) bool {
	r, ok := req.(*mcp.ReadResourceRequest)
	if !ok || r.Params == nil {
		return false
	}
	u := r.Params.URI
	return strings.HasPrefix(u, ObsURIPrefix) || strings.HasPrefix(u, historyPrefix) || u == SiteHistoryIndexURI || u == AlarmsURI
}

// ObsURITemplate serves the observation of a capability that is not
// exposed (expose: false): it has no listed resource, as it has no tool,
// and is read and subscribed to by its URI all the same.
const ObsURITemplate = ObsURIPrefix + "{capability}"

// syncObservationResources lists physmcp://obs/<capability> for every
// exposed capability of the manifest in force and, while some capability
// is not exposed, serves the others through ObsURITemplate: a site of
// 10 000 observed points lists the resources of its tools, not 10 000 (the
// server would also keep 10 000 registrations). A manifest reload adds and
// removes them; every read looks its capability up in the manifest in
// force.
func (s *Server) syncObservationResources() {
	s.obsMu.Lock()
	defer s.obsMu.Unlock()
	if s.obsListed == nil {
		s.obsListed = map[string]bool{}
	}
	want := map[string]*manifest.Capability{}
	hidden := false
	for _, c := range s.n.Manifest().Capabilities {
		if c.Exposed() {
			want[ObsURIPrefix+c.Name] = c
		} else {
			hidden = true
		}
	}
	for uri := range s.obsListed {
		if want[uri] == nil {
			s.mcp.RemoveResources(uri)
			delete(s.obsListed, uri)
		}
	}
	for uri, c := range want {
		if s.obsListed[uri] {
			continue
		}
		s.obsListed[uri] = true
		tool := c.ToolName()
		s.mcp.AddResource(&mcp.Resource{
			URI: uri, Name: "obs_" + c.Name, Title: "Current observation of " + tool,
			Description: "The current observation of " + tool + " (value, unit, quality, timestamp, age_ms), as read_ answers it. " +
				"Subscribe to be told when it changes beyond the capability's deadband or its quality changes (at most one update per " + s.obsMin.String() + ").",
			MIMEType: "application/json",
		}, s.readObservation)
	}
	switch {
	case hidden && !s.obsTemplate:
		s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{
			URITemplate: ObsURITemplate, Name: "obs", Title: "Current observation of a point that is not a tool",
			Description: "The current observation (value, unit, quality, timestamp, age_ms) of a capability the manifest observes but does not expose as a tool (expose: false); " +
				"physmcp://manifest lists them. Subscribe to be told when it changes beyond its deadband or its quality changes (at most one update per " + s.obsMin.String() + ").",
			MIMEType: "application/json",
		}, s.readObservation)
	case !hidden && s.obsTemplate:
		s.mcp.RemoveResourceTemplates(ObsURITemplate)
	}
	s.obsTemplate = hidden
}

// readObservation answers a read of physmcp://obs/<capability>: the
// observation read_ would answer, within the endpoint's view.
func (s *Server) readObservation(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	name, _ := strings.CutPrefix(uri, ObsURIPrefix)
	c := s.n.Manifest().Capability(name)
	if c == nil {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if !s.inView(req.Extra, c) {
		return nil, s.notInView(req.Extra, uri)
	}
	o, err := s.n.Read(ctx, c.ToolName(), -1)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(body)}}}, nil
}
