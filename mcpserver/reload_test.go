package mcpserver_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
	"github.com/physd/physd/store"
	"github.com/physd/physd/web"
)

// reloadSurface is the greenhouse served over HTTP with no policy (the
// views are then the only thing that narrows what an agent reaches), and a
// way to put another manifest in force as physd's reloader does.
type reloadSurface struct {
	*surface
	n   *node.Node
	mcp *mcpserver.Server
}

func newReloadSurface(t *testing.T) *reloadSurface {
	t.Helper()
	m, err := manifest.Load(example("physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(dir, "audit"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	plant := n.Buses()["plant"].(*sim.Plant)
	srv := mcpserver.New(n, mcpserver.Options{Audit: al})
	hs := httptest.NewServer(web.New(srv, web.Options{Audit: al}).Handler())
	t.Cleanup(func() {
		hs.Close()
		n.Close(context.Background())
		al.Close()
		st.Close()
	})
	return &reloadSurface{surface: &surface{srv: hs, plant: plant}, n: n, mcp: srv}
}

// reload puts the greenhouse manifest, edited by edit, in force.
func (s *reloadSurface) reload(t *testing.T, edit func(string) string) {
	t.Helper()
	b, err := os.ReadFile(example("physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Parse(example("physmcp.manifest.yml"), []byte(edit(string(b))))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.n.Reload(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	s.mcp.ManifestReloaded()
}

func withoutViews(s string) string { return s[:strings.Index(s, "\nviews:")+1] }

// holdBody delays the body of the next tools/call until the server has
// begun reading it (Expect: 100-continue: the server asks for the body
// only once its handler reads, after the endpoint was routed), and runs
// between() then.
type holdBody struct {
	mu      sync.Mutex
	between func()
}

func (h *holdBody) RoundTrip(r *http.Request) (*http.Response, error) {
	h.mu.Lock()
	f := h.between
	h.between = nil
	h.mu.Unlock()
	if f != nil && r.Method == http.MethodPost && r.Body != nil {
		r = r.Clone(r.Context())
		r.Header.Set("Expect", "100-continue")
		body := r.Body
		var once sync.Once
		r.Body = readerFunc{func(p []byte) (int, error) {
			once.Do(f)
			return body.Read(p)
		}, body}
	}
	return tr.RoundTrip(r)
}

type readerFunc struct {
	read func([]byte) (int, error)
	io.Closer
}

func (r readerFunc) Read(p []byte) (int, error) { return r.read(p) }

var tr = &http.Transport{ExpectContinueTimeout: 1e12}

// TestReloadRemovingAViewClosesItsEndpoint: a call through /mcp/<view> that
// was routed just before a reload removed the view must not run with no
// view at all: outside the view it was refused before, so it is refused
// now (or answered 404), and the plant is not written.
func TestReloadRemovingAViewClosesItsEndpoint(t *testing.T) {
	s := newReloadSurface(t)
	hold := &holdBody{}
	c := mcp.NewClient(&mcp.Implementation{Name: "reload-test", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: s.srv.URL + "/mcp/observe", HTTPClient: &http.Client{Transport: hold}},
		&mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	before := s.plant.Stats().Writes
	hold.mu.Lock()
	hold.between = func() { s.reload(t, withoutViews) }
	hold.mu.Unlock()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_fan_zone_b", Arguments: map[string]any{"value": 40, "idempotency_key": "view-gone-1"}})
	if err == nil && !res.IsError {
		t.Errorf("do_fan_zone_b through the observe view, removed while the call was routed, ran: %s", text(res))
	} else if err == nil && !strings.Contains(text(res), `the view "observe" of this endpoint was removed by a manifest reload`) {
		t.Errorf("the refusal does not say the view was removed: %s", text(res))
	}
	if w := s.plant.Stats().Writes - before; w != 0 {
		t.Errorf("a call through a removed view wrote the plant %d times", w)
	}
	hold.mu.Lock()
	defer hold.mu.Unlock()
	if hold.between != nil {
		t.Fatal("the call's body was never held")
	}
}

// TestReloadDuringAnApprovalRound: the human was shown do_heater_zone_a
// as it was defined when the round began; a reload redefines it before
// the human's confirmation comes back. The confirmation is for the old
// definition: it does not run the new one (a fresh round shows it).
func TestReloadDuringAnApprovalRound(t *testing.T) {
	r := newRig(t, true)
	p := heat70("round-across-reload")
	round := r.call(t, p)
	if !round.NeedsInput() {
		t.Fatalf("want an approval round, got %+v", round)
	}
	b, err := os.ReadFile(example("physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	const from = "description: Heating power in zone A as a percentage of the heater's rating."
	if !strings.Contains(src, from) {
		t.Fatal("the greenhouse manifest changed: update this test")
	}
	m, err := manifest.Parse(example("physmcp.manifest.yml"), []byte(strings.Replace(src, from,
		"description: Heating power of the seedling bench's under-soil heater (zone A) as a percentage of its rating.", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.n.Reload(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	r.srv.ManifestReloaded()
	again := r.call(t, answer(round, p, "accept", true))
	if r.writes() != 0 {
		t.Errorf("a confirmation of the old definition actuated the redefined heater: %v", again.Content)
	}
	if !again.NeedsInput() {
		t.Errorf("want a fresh round, got %v", again.Content)
	} else if el, _ := again.InputRequests["approval"].(*mcp.ElicitParams); el == nil || !strings.Contains(el.Message, "seedling bench") {
		t.Errorf("the fresh round does not show the new definition: %+v", again.InputRequests)
	}
}

// TestReloadAddsAndChangesViews: a view a reload adds is served at once
// at /mcp/<view>; a view whose selector a reload changes lists what it
// selects now; a removed view's endpoint answers 404.
func TestReloadAddsAndChangesViews(t *testing.T) {
	s := newReloadSurface(t)
	withFans := func(tags string) func(string) string {
		return func(src string) string {
			return withoutViews(src) + "views:\n  fans:\n    description: Fans.\n    tags: [" + tags + "]\n"
		}
	}
	s.reload(t, withFans("fan"))
	if got := toolNames(t, connectPath(t, s.surface, "/mcp/fans", "2025-11-25", "")); !slices.Equal(got, []string{"can_do", "do_fan_zone_b"}) {
		t.Errorf("the added view lists %v", got)
	}
	s.reload(t, withFans("vent"))
	if got := toolNames(t, connectPath(t, s.surface, "/mcp/fans", "2025-11-25", "")); !slices.Equal(got, []string{"can_do", "do_vent_zone_c"}) {
		t.Errorf("the changed view lists %v", got)
	}
	s.reload(t, withoutViews)
	resp, err := http.Post(s.srv.URL+"/mcp/fans", "application/json", strings.NewReader(discover))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the removed view's endpoint: %d", resp.StatusCode)
	}
}
