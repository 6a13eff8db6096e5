package mcpserver_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
)

// TestCallerTicketLivesWithItsRequest: the boundary's caller ticket reads
// back as the caller while its request is in flight, not after release, and
// a ticket made up by someone who does not hold the process's secret (or
// another process's ticket) reads as no caller.
func TestCallerTicketLivesWithItsRequest(t *testing.T) {
	a, b := newSurface(t, "", mcpserver.Options{}, nil).mcp, newSurface(t, "", mcpserver.Options{}, nil).mcp
	r, _ := http.NewRequest("GET", "/", nil)
	alice := node.Caller{ID: "alice", Role: "operator", Transport: "http", Credentials: []string{"token:alice"}}
	release := a.StampCaller(r, alice)
	if c, ok := a.StampedCaller(r.Header); !ok || c.ID != "alice" || c.Role != "operator" {
		t.Fatalf("in flight: %+v %v", c, ok)
	}
	if _, ok := b.StampedCaller(r.Header); ok {
		t.Error("another server accepted this server's ticket")
	}
	ticket := r.Header.Get(mcpserver.CallerHeader)
	for _, forged := range []string{"", "1", ticket + "0", strings.TrimSuffix(ticket, ticket[len(ticket)-1:]) + "z", "x" + ticket} {
		h := http.Header{}
		h.Set(mcpserver.CallerHeader, forged)
		if c, ok := a.StampedCaller(h); ok {
			t.Errorf("forged ticket %q read as %+v", forged, c)
		}
	}
	release()
	if c, ok := a.StampedCaller(r.Header); ok {
		t.Errorf("after its request was served the ticket still reads as %+v", c)
	}
}
