package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/history"
)

// HistoryURITemplate is the history of one capability: buckets of step
// (min, max, mean, count, good_share, last) from since to until.
//
// A resource template rather than an argument of read_: a history is data
// an agent or its host fetches by address (and may attach as context),
// not an observation; read_'s arguments and proMCP answer stay as the
// standard has them; and one template serves every capability without a
// tool per capability or a larger tool list.
const HistoryURITemplate = "physmcp://history/{capability}{?since,until,step}"

const historyPrefix = "physmcp://history/"

func (s *Server) addHistoryResource(h *history.History) {
	res := h.Config().Resolution
	s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: HistoryURITemplate, Name: "history", Title: "History of a capability",
		Description: fmt.Sprintf("Downsampled history of a numeric capability: buckets of step with min, max, mean, count, good_share (share of observations of good quality) and last. "+
			"since and until are RFC 3339 times or durations before now (since=1h); default the last hour until now. step is a duration, a multiple of %v (default %v). "+
			"Example: physmcp://history/temperature_zone_a?since=1h&step=1m", res, res),
		MIMEType: "application/json",
	}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		name, since, until, step, err := parseHistoryURI(req.Params.URI, time.Now())
		// Through a view, only the view's capabilities: one a reload
		// removed (its history kept until retention) is in no view.
		if c := s.n.Manifest().Capability(name); err == nil && (c != nil && !s.inView(req.Extra, c) || c == nil && s.scopeOf(req.Extra).view != nil) {
			return nil, s.notInView(req.Extra, req.Params.URI)
		}
		if err == nil {
			var series *history.Series
			if series, err = h.Query(name, since, until, step); err == nil {
				body, err := json.Marshal(series)
				if err != nil {
					return nil, err
				}
				return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "application/json", Text: string(body)}}}, nil
			}
		}
		var qe *history.QueryError
		if errors.As(err, &qe) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: req.Params.URI + ": " + err.Error()}
		}
		return nil, err
	})
}

// parseHistoryURI reads physmcp://history/<capability>?since=…&until=…&step=….
func parseHistoryURI(uri string, now time.Time) (name string, since, until time.Time, step time.Duration, err error) {
	u, perr := url.Parse(uri)
	if perr != nil || !strings.HasPrefix(uri, historyPrefix) {
		return "", since, until, 0, &history.QueryError{Msg: "not a history URI; fix: physmcp://history/<capability>?since=1h&step=1m"}
	}
	name = strings.TrimPrefix(u.Path, "/")
	q := u.Query()
	when := func(key string, def time.Time) (time.Time, error) {
		v := q.Get(key)
		if v == "" {
			return def, nil
		}
		if t, err := time.Parse(time.RFC3339, v); err == nil {
			return t, nil
		}
		if d, err := time.ParseDuration(strings.TrimPrefix(v, "-")); err == nil && d >= 0 {
			return now.Add(-d), nil
		}
		return def, &history.QueryError{Msg: fmt.Sprintf("%s: %q is neither an RFC 3339 time nor a duration; fix: e.g. %s=2026-12-01T10:00:00Z or %s=1h (one hour ago)", key, v, key, key)}
	}
	if until, err = when("until", now); err != nil {
		return
	}
	if since, err = when("since", until.Add(-time.Hour)); err != nil {
		return
	}
	if v := q.Get("step"); v != "" {
		if step, err = time.ParseDuration(v); err != nil || step <= 0 {
			return name, since, until, 0, &history.QueryError{Msg: fmt.Sprintf("step: %q is not a positive duration; fix: e.g. step=1m", v)}
		}
	}
	return name, since, until, step, nil
}
