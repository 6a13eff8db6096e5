package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/web"
)

// listener connects through path (2026-07-28) and reports every
// resources/updated URI it receives.
func listener(t *testing.T, s *surface, path, token string) (*mcp.ClientSession, chan string) {
	t.Helper()
	got := make(chan string, 64)
	hc := &http.Client{Transport: bearerRT{map[string]string{"Authorization": "Bearer " + token}, http.DefaultTransport}}
	c := mcp.NewClient(&mcp.Implementation{Name: "views-listen", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			got <- req.Params.URI
		},
	})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: s.srv.URL + path, HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, got
}

// TestViewSubscriptionsAreABoundary: through /mcp/zone_a a subscription to
// an observation outside the view receives nothing while that capability
// moves, and a raw subscriptions/listen for it is refused as its read is;
// one inside the view is updated (so the test can tell).
func TestViewSubscriptionsAreABoundary(t *testing.T) {
	s := newSurface(t, greenhousePolicy(t), web.Options{}, nil)
	ctx := context.Background()
	outside := mcpserver.ObsURIPrefix + "fan_zone_b"
	inside := mcpserver.ObsURIPrefix + "heater_zone_a"

	// A raw listen request through the view: refused with the read's error.
	body := `{"jsonrpc":"2.0","id":7,"method":"subscriptions/listen","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}},"notifications":{"resourceSubscriptions":["` + outside + `"]}}}`
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/mcp/zone_a", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+operatorToken)
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	ctxT, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctxT))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	resp.Body.Close()
	if !strings.Contains(string(buf[:n]), "is not in the view") {
		t.Errorf("subscriptions/listen outside the view: %d %s", resp.StatusCode, buf[:n])
	}

	viewCS, viewGot := listener(t, s, "/mcp/zone_a", operatorToken)
	if err := viewCS.Subscribe(ctx, &mcp.SubscribeParams{URI: outside}); err != nil && !strings.Contains(err.Error(), "not in the view") {
		t.Fatal(err)
	}
	inCS, inGot := listener(t, s, "/mcp/zone_a", operatorToken)
	if err := inCS.Subscribe(ctx, &mcp.SubscribeParams{URI: inside}); err != nil {
		t.Fatal(err)
	}
	site := connectPath(t, s, "/mcp", "2026-07-28", operatorToken)
	deadline := time.Now().Add(10 * time.Second)
	sawInside := false
	for i := 0; time.Now().Before(deadline) && !sawInside; i++ {
		for _, c := range []struct {
			tool  string
			value int
		}{{"do_fan_zone_b", 20 + 30*(i%2)}, {"do_heater_zone_a", 10 + 20*(i%2)}} {
			res, err := site.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: map[string]any{"value": c.value, "idempotency_key": c.tool + "-" + string(rune('a'+i))}})
			if err != nil || res.IsError {
				t.Fatalf("%s: %v %v", c.tool, err, res)
			}
		}
		select {
		case u := <-inGot:
			sawInside = u == inside
		case <-time.After(300 * time.Millisecond):
		}
	}
	if !sawInside {
		t.Fatal("the in-view subscription got no update: the test cannot tell")
	}
	time.Sleep(1500 * time.Millisecond) // updates are rate-limited to one a second per resource
	close(viewGot)
	for u := range viewGot {
		if u == outside {
			t.Fatalf("a subscriber of /mcp/zone_a was sent %s", u)
		}
	}
}

// TestViewResourcesNameOnlyTheView: physmcp://policy, physmcp://views and
// physmcp://manifest read through a view name no capability outside it.
func TestViewResourcesNameOnlyTheView(t *testing.T) {
	s := newSurface(t, greenhousePolicy(t), web.Options{}, nil)
	ctx := context.Background()
	for _, era := range eras {
		cs := connectPath(t, s, "/mcp/zone_a", era, operatorToken)
		for _, uri := range []string{mcpserver.PolicyURI, mcpserver.ViewsURI, "physmcp://manifest"} {
			res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
			if err != nil {
				t.Fatalf("%s %s: %v", era, uri, err)
			}
			text := res.Contents[0].Text
			for _, outside := range []string{"fan_zone_b", "vent_zone_c", "heater_zone_c", "zone_b", "\"name\":\"water\"", "\"name\": \"water\"", "\"name\": \"observe\""} {
				if strings.Contains(text, outside) {
					t.Errorf("%s: %s through /mcp/zone_a names %s:\n%s", era, uri, outside, text)
				}
			}
		}
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.PolicyURI})
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Tools map[string]any `json:"tools"`
		}
		json.Unmarshal([]byte(res.Contents[0].Text), &doc)
		var tools []string
		for k := range doc.Tools {
			tools = append(tools, k)
		}
		slices.Sort(tools)
		if !slices.Equal(tools, []string{"do_heater_zone_a", "do_irrigation_valve"}) {
			t.Errorf("%s: policy tools through the view: %v", era, tools)
		}
	}
	// The whole site still sees everything.
	cs := connectPath(t, s, "/mcp", "2026-07-28", operatorToken)
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.PolicyURI})
	if err != nil || !strings.Contains(res.Contents[0].Text, "do_fan_zone_b") {
		t.Errorf("the site's policy: %v", err)
	}
}
