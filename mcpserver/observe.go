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
	sub := s.n.Subscribe(0)
	go func() {
		defer lim.stop()
		for {
			select {
			case <-sub.Done():
				return
			case o := <-sub.C:
				if o.Changed {
					lim.hit(ObsURIPrefix + o.Cap.Name)
				}
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

// syncObservationResources lists physmcp://obs/<capability> for every
// capability of the manifest in force; a manifest reload adds, re-adds
// (the view check reads the capability's definition) and removes them.
func (s *Server) syncObservationResources() {
	s.obsMu.Lock()
	defer s.obsMu.Unlock()
	if s.obsListed == nil {
		s.obsListed = map[string]string{}
	}
	want := map[string]*manifest.Capability{}
	for _, c := range s.n.Manifest().Capabilities {
		want[ObsURIPrefix+c.Name] = c
	}
	for uri := range s.obsListed {
		if want[uri] == nil {
			s.mcp.RemoveResources(uri)
			delete(s.obsListed, uri)
		}
	}
	for uri, c := range want {
		def, _ := json.Marshal(c)
		if s.obsListed[uri] == string(def) {
			continue
		}
		s.obsListed[uri] = string(def)
		tool := c.ToolName()
		s.mcp.AddResource(&mcp.Resource{
			URI: uri, Name: "obs_" + c.Name, Title: "Current observation of " + tool,
			Description: "The current observation of " + tool + " (value, unit, quality, timestamp, age_ms), as read_ answers it. " +
				"Subscribe to be told when it changes beyond the capability's deadband or its quality changes (at most one update per " + s.obsMin.String() + ").",
			MIMEType: "application/json",
		}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			if !s.inView(req.Extra, c) {
				return nil, s.notInView(req.Extra, uri)
			}
			o, err := s.n.Read(ctx, tool, -1)
			if err != nil {
				return nil, err
			}
			body, err := json.Marshal(o)
			if err != nil {
				return nil, err
			}
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(body)}}}, nil
		})
	}
}
