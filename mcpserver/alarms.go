package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// AlarmsURI is the resource holding the alarms raised now; a subscriber is
// told when one is raised or cleared.
const AlarmsURI = "physmcp://alarms"

func (s *Server) addAlarmsResource(e *alarms.Engine) {
	s.mcp.AddResource(&mcp.Resource{
		URI: AlarmsURI, Name: "alarms", Title: "Active alarms",
		Description: "The alarms raised now (capabilities[].alarms of the manifest: high, low, quality, stale), each with its capability, kind, since and message. Subscribe to be told when one is raised or cleared.",
		MIMEType:    "application/json",
	}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		body, err := json.Marshal(map[string]any{"active": s.activeInView(s.scopeOf(req.Extra).view)})
		if err != nil {
			return nil, err
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: AlarmsURI, MIMEType: "application/json", Text: string(body)}}}, nil
	})
	e.OnEvent(func(alarms.Event) {
		_ = s.mcp.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: AlarmsURI})
	})
}

// activeInView lists the alarms raised now on capabilities v selects
// (every one for nil).
func (s *Server) activeInView(v *manifest.View) []alarms.Active {
	active := []alarms.Active{}
	if s.opts.Alarms == nil {
		return active
	}
	m := s.n.Manifest()
	for _, a := range s.opts.Alarms.Active() {
		if c := s.capOfTool(a.Capability); c != nil && (v == nil || v.Match(m.Subject(c))) {
			active = append(active, a)
		}
	}
	return active
}

// alarmsSeen names the alarms raised now that v shows, as they were
// raised (not their changing values): an update of physmcp://alarms is
// sent to a subscriber of v only when it changes.
func (s *Server) alarmsSeen(v *manifest.View) string {
	if s.opts.Sites != nil {
		return s.siteAlarmsSeen(v)
	}
	var b strings.Builder
	for _, a := range s.activeInView(v) {
		fmt.Fprintf(&b, "%s\x00%s\x00%s\n", a.Capability, a.Kind, a.Since.Format(time.RFC3339Nano))
	}
	return b.String()
}

func (s *Server) capOfTool(tool string) *manifest.Capability { return s.n.Manifest().Tool(tool) }

// alarmContext adds to a can_do report the alarms raised now on the
// capabilities it names (candidates, blocked, related reads).
func alarmContext(e *alarms.Engine, rep *promcp.CapabilityReport) {
	named := map[string]bool{}
	for _, c := range rep.Candidates {
		named[c.Capability] = true
	}
	for _, b := range rep.Blocked {
		named[b.Capability] = true
	}
	for _, r := range rep.Context.RelatedReads {
		named[r] = true
	}
	for _, a := range e.Active() {
		if named[a.Capability] {
			rep.Context.ActiveAlarms = append(rep.Context.ActiveAlarms, promcp.ActiveAlarm{Capability: a.Capability, Kind: a.Kind, Since: a.Since, Message: a.Message})
		}
	}
}
