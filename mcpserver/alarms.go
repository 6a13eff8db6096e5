package mcpserver

import (
	"context"
	"encoding/json"

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
		active := []alarms.Active{}
		for _, a := range e.Active() {
			if c := s.capOfTool(a.Capability); c != nil && s.inView(req.Extra, c) {
				active = append(active, a)
			}
		}
		body, err := json.Marshal(map[string]any{"active": active})
		if err != nil {
			return nil, err
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: AlarmsURI, MIMEType: "application/json", Text: string(body)}}}, nil
	})
	e.OnEvent(func(alarms.Event) {
		_ = s.mcp.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: AlarmsURI})
	})
}

func (s *Server) capOfTool(tool string) *manifest.Capability {
	for _, c := range s.n.Manifest().Capabilities {
		if c.ToolName() == tool {
			return c
		}
	}
	return nil
}

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
