// Package bare is the baseline: a bare go-sdk server with one trivial tool,
// served with the same Streamable HTTP options physd uses (stateless, JSON
// responses), so a physd/bare ratio isolates physd's own cost.
package bare

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// EchoIn is the echo tool's input.
type EchoIn struct {
	Text string `json:"text,omitempty" jsonschema:"text to echo back"`
}

// EchoOut is its structured result.
type EchoOut struct {
	Echo string `json:"echo"`
	N    int    `json:"n"`
}

// NewServer returns the bare MCP server with the single "echo" tool, added
// with the SDK's typed mcp.AddTool (schemas inferred, input and output
// validated by the SDK).
func NewServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "baresdk", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echo the text back."},
		func(_ context.Context, _ *mcp.CallToolRequest, in EchoIn) (*mcp.CallToolResult, EchoOut, error) {
			return nil, EchoOut{Echo: in.Text, N: len(in.Text)}, nil
		})
	return s
}

// Handler serves the server at any path with physd's transport options.
func Handler(s *mcp.Server) http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, MaxRequestBodyBytes: 1 << 20})
}

// NewRawServer is the same server with echo registered the way physd
// registers its tools: Server.AddTool with a fixed input schema and a raw
// handler (no SDK-side schema inference or validation), returning the JSON
// as structured content and text like physd's results.
func NewRawServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "baresdk", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{
		Name:         "echo",
		Description:  "Echo the text back.",
		InputSchema:  json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"additionalProperties":false}`),
		OutputSchema: json.RawMessage(`{"type":"object","properties":{"echo":{"type":"string"},"n":{"type":"integer"}},"required":["echo","n"]}`),
	}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in EchoIn
		if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, nil
		}
		body, err := json.Marshal(EchoOut{Echo: in.Text, N: len(in.Text)})
		if err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(body)}}, StructuredContent: json.RawMessage(body)}, nil
	})
	return s
}
