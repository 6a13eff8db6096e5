package mcpserver

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/physd/physd/node"
)

// Who calls over HTTP is decided by physd's HTTP boundary (package web),
// once per request: Host, Origin, then the bearer token, JWT or client
// certificate. The boundary hands its verdict to the MCP handlers in an
// internal header (StampCaller), because the SDK gives a handler the
// request's headers (mcp.RequestExtra.Header) but not its context, so a
// request is authenticated exactly once and mTLS identities reach the
// tools.

// CallerHeader carries the boundary's verdict to the MCP tool handlers.
// The boundary deletes any value a client sent and the value is MACed with
// a per-process key, so a request that bypassed the boundary cannot forge
// it.
const CallerHeader = "Physd-Verified-Caller"

func newCallerKey() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return k
}

// StampCaller puts the caller the boundary established on r, for the MCP
// handlers (and the boundary's own routes) to read with StampedCaller.
func (s *Server) StampCaller(r *http.Request, c node.Caller) {
	body, _ := json.Marshal(c)
	m := hmac.New(sha256.New, s.callerKey)
	m.Write(body)
	r.Header.Set(CallerHeader, base64.RawURLEncoding.EncodeToString(body)+"."+base64.RawURLEncoding.EncodeToString(m.Sum(nil)))
}

// StampedCaller reads a caller the boundary stamped; ok is false when
// there is none or it does not verify.
func (s *Server) StampedCaller(h http.Header) (node.Caller, bool) {
	body64, mac64, found := strings.Cut(h.Get(CallerHeader), ".")
	if !found {
		return node.Caller{}, false
	}
	body, err1 := base64.RawURLEncoding.DecodeString(body64)
	mac, err2 := base64.RawURLEncoding.DecodeString(mac64)
	if err1 != nil || err2 != nil {
		return node.Caller{}, false
	}
	m := hmac.New(sha256.New, s.callerKey)
	m.Write(body)
	var c node.Caller
	if !hmac.Equal(mac, m.Sum(nil)) || json.Unmarshal(body, &c) != nil {
		return node.Caller{}, false
	}
	return c, true
}

// authenticate is the caller of an MCP request over HTTP, given its
// headers: the one the boundary established. The endpoints (Endpoint) are
// served only behind the boundary, which stamps every request it lets
// through to them; a request without a stamp that verifies has no caller.
func (s *Server) authenticate(h http.Header) (node.Caller, error) {
	if c, ok := s.StampedCaller(h); ok {
		return c, nil
	}
	if h.Get(CallerHeader) != "" {
		return node.Caller{}, errors.New("the request's caller stamp does not verify")
	}
	return node.Caller{}, errors.New("the request did not pass physd's HTTP boundary, which establishes the caller")
}
