// Package rawmcp sends MCP tools/call requests as raw HTTP JSON-RPC in the
// 2026-07-28 (stateless) form, with keep-alive connections, and checks the
// answers. It is shared by the loadgen program and the go test benchmarks so
// both measure exactly the same request.
package rawmcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// ProtocolVersion is the modern (per-request _meta) MCP protocol version.
const ProtocolVersion = "2026-07-28"

// Body returns a tools/call JSON-RPC request. args must be a JSON object.
func Body(id int64, tool string, args []byte) []byte {
	b := make([]byte, 0, 256+len(args))
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"method":"tools/call","params":{"name":`...)
	b = strconv.AppendQuote(b, tool)
	b = append(b, `,"arguments":`...)
	b = append(b, args...)
	b = append(b, `,"_meta":{"io.modelcontextprotocol/protocolVersion":"`+ProtocolVersion+`","io.modelcontextprotocol/clientCapabilities":{}}}}`...)
	return b
}

// NewHTTPClient returns a client keeping up to conns idle keep-alive
// connections to one host (one per concurrent worker).
func NewHTTPClient(conns int) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns * 2,
		MaxIdleConnsPerHost: conns * 2,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// Result is the part of a tools/call answer the benchmarks check.
type Result struct {
	Result *struct {
		IsError           bool            `json:"isError"`
		StructuredContent json.RawMessage `json:"structuredContent"`
	} `json:"result"`
	Error *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Call posts one tools/call to url (the /mcp endpoint) and returns the
// structured content of a successful result. A transport error, a non-200
// status, a JSON-RPC error or an isError result is an error.
func Call(ctx context.Context, hc *http.Client, url string, id int64, tool string, args []byte) (json.RawMessage, error) {
	raw, err := post(ctx, hc, url, "tools/call", tool, Body(id, tool, args))
	if err != nil {
		return nil, err
	}
	var r Result
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("bad JSON-RPC answer: %v: %.200s", err, raw)
	}
	switch {
	case r.Error != nil:
		return nil, fmt.Errorf("JSON-RPC error %d: %s", r.Error.Code, r.Error.Message)
	case r.Result == nil:
		return nil, fmt.Errorf("no result: %.200s", raw)
	case r.Result.IsError:
		return nil, fmt.Errorf("isError result: %.300s", raw)
	}
	return r.Result.StructuredContent, nil
}

// Outcome is the part of a physd structured result the checks read.
type Outcome struct {
	Quality  string `json:"quality"`  // read_
	Cached   *bool  `json:"cached"`   // read_
	Status   string `json:"status"`   // do_
	Feasible *bool  `json:"feasible"` // can_do
	Echo     string `json:"echo"`     // bare echo
}

// post sends one JSON-RPC request of method (name: its Mcp-Name header) and
// returns the answer's body; a transport error or a non-200 status is an
// error.
func post(ctx context.Context, hc *http.Client, url, method, name string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	h := req.Header
	h["Content-Type"] = []string{"application/json"}
	h["Accept"] = []string{"application/json, text/event-stream"}
	h["Mcp-Protocol-Version"] = []string{ProtocolVersion}
	h["Mcp-Method"] = []string{method}
	h["Mcp-Name"] = []string{name}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, raw)
	}
	return raw, nil
}

// ReadResource posts one resources/read of uri and returns the text of its
// first content. A JSON-RPC error is an error.
func ReadResource(ctx context.Context, hc *http.Client, url string, id int64, uri string) (string, error) {
	b := make([]byte, 0, 256)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"method":"resources/read","params":{"uri":`...)
	b = strconv.AppendQuote(b, uri)
	b = append(b, `,"_meta":{"io.modelcontextprotocol/protocolVersion":"`+ProtocolVersion+`","io.modelcontextprotocol/clientCapabilities":{}}}}`...)
	raw, err := post(ctx, hc, url, "resources/read", uri, b)
	if err != nil {
		return "", err
	}
	var r struct {
		Result *struct {
			Contents []struct {
				Text string `json:"text"`
			} `json:"contents"`
		} `json:"result"`
		Error *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return "", fmt.Errorf("bad JSON-RPC answer: %v: %.200s", err, raw)
	}
	switch {
	case r.Error != nil:
		return "", fmt.Errorf("JSON-RPC error %d: %s", r.Error.Code, r.Error.Message)
	case r.Result == nil || len(r.Result.Contents) == 0:
		return "", fmt.Errorf("no contents: %.200s", raw)
	}
	return r.Result.Contents[0].Text, nil
}
