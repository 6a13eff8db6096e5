package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Views are a boundary for every MCP method (issue #22): subscriptions in
// both eras, and every document an agent can read through a view.

// outsideZoneA names what /mcp/zone_a must never show: the greenhouse's
// capabilities outside zone A, and the other views.
var outsideZoneA = []string{"zone_b", "zone_c", "rain_tank_level", "fan_zone_b", "vent_zone_c", "heater_zone_c",
	`"name": "water"`, `"name": "observe"`, "/mcp/water", "/mcp/observe", "circulation_fan", "roof_vent"}

// updates collects the URIs of notifications/resources/updated a client
// receives.
type updates struct {
	mu  sync.Mutex
	got []string
}

func (u *updates) add(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.got = append(u.got, r.Params.URI)
}

func (u *updates) has(uri string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, g := range u.got {
		if g == uri {
			return true
		}
	}
	return false
}

func (u *updates) all() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.got...)
}

// listenOn connects through path (2026-07-28) with token, telling u of
// every update.
func listenOn(t *testing.T, d *daemon, path, era, token string, u *updates) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "views-boundary-e2e", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}, ResourceUpdatedHandler: u.add})
	hc := &http.Client{Transport: bearer{token, http.DefaultTransport}}
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: d.url(path), HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: era})
	if err != nil {
		t.Fatalf("connect %s (%s): %v\n%s", path, era, err, d.stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// listenBody is a 2026-07-28 subscriptions/listen request for uris.
func listenBody(id int, uris ...string) string {
	subs, _ := json.Marshal(uris)
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"subscriptions/listen","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",`+
		`"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}},"notifications":{"resourceSubscriptions":%s}}}`, id, subs)
}

// rawListenHTTP posts a subscriptions/listen through path and returns the
// first message of the answer: the acknowledgement or the error.
func rawListenHTTP(t *testing.T, d *daemon, path, token string, uris ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url(path), strings.NewReader(listenBody(7, uris...)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data:"); ok {
			return strings.TrimSpace(data)
		}
		if strings.HasPrefix(sc.Text(), "{") {
			return sc.Text()
		}
	}
	t.Fatalf("listen through %s: no message (status %d)", path, resp.StatusCode)
	return ""
}

// errorMessage is the message of a JSON-RPC error answer ("" if none).
func errorMessage(msg string) string {
	var m struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(msg), &m) != nil || m.Error == nil {
		return ""
	}
	return m.Error.Message
}

// readError is the message the read of uri through cs is refused with.
func readError(t *testing.T, cs *mcp.ClientSession, uri string) string {
	t.Helper()
	_, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
	if err == nil {
		t.Fatalf("%s read outside the view", uri)
	}
	// Without the SDK's "calling …: " and, over HTTP, ": rejected by transport: …".
	msg := err.Error()
	msg, _, _ = strings.Cut(msg[max(0, strings.Index(msg, uri)):], ": rejected by transport")
	return msg
}

// moveUntil actuates do_fan_zone_b (outside zone A) and do_heater_zone_a
// (inside) through the whole site's endpoint until done reports true or
// the wait ends; the fan is moved every round, the heater once (its
// cooldown is 15 s).
func moveUntil(t *testing.T, site *mcp.ClientSession, tag string, done func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		calls := []struct {
			tool  string
			value int
		}{{"do_fan_zone_b", 20 + 40*(i%2)}}
		if i == 0 {
			calls = append(calls, struct {
				tool  string
				value int
			}{"do_heater_zone_a", 30})
		}
		for _, c := range calls {
			a := doCall(t, site, c.tool, map[string]any{"value": c.value, "idempotency_key": fmt.Sprintf("vb-%s-%s-%d", tag, c.tool, i)})
			if a.toolErr != "" || a.Status != "success" {
				t.Fatalf("%s %d: %s %s", c.tool, c.value, a.raw, a.toolErr)
			}
		}
		time.Sleep(400 * time.Millisecond)
		if done() {
			return true
		}
	}
	return false
}

// TestViewsBoundarySubscriptionsHTTP: through /mcp/zone_a a 2026-07-28
// subscriptions/listen for fan_zone_b is refused with the error its read
// gets (and a 2025-11-25 resources/subscribe too); while the fan moves, a
// listener of the view is told of heater_zone_a (inside) and never of
// fan_zone_b, which a listener of /mcp is told of.
func TestViewsBoundarySubscriptionsHTTP(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	fan, heater := "physmcp://obs/fan_zone_b", "physmcp://obs/heater_zone_a"

	view := connectAsPath(t, d, "/mcp/zone_a", adminDemoToken)
	refusal := readError(t, view, fan)
	if !strings.Contains(refusal, `is not in the view "zone_a"`) {
		t.Fatalf("read of %s through /mcp/zone_a: %s", fan, refusal)
	}
	for _, uris := range [][]string{{fan}, {heater, fan}} {
		got := rawListenHTTP(t, d, "/mcp/zone_a", adminDemoToken, uris...)
		if msg := errorMessage(got); msg != refusal {
			t.Errorf("subscriptions/listen %v through /mcp/zone_a: %s (want the read's error %q)", uris, got, refusal)
		}
	}
	if got := rawListenHTTP(t, d, "/mcp", adminDemoToken, fan); !strings.Contains(got, "notifications/subscriptions/acknowledged") {
		t.Errorf("subscriptions/listen for %s through /mcp: %s", fan, got)
	}
	legacy := listenOn(t, d, "/mcp/zone_a", "2025-11-25", adminDemoToken, &updates{})
	if err := legacy.Subscribe(context.Background(), &mcp.SubscribeParams{URI: fan}); err == nil || !strings.Contains(err.Error(), refusal) {
		t.Errorf("2025-11-25 resources/subscribe %s through /mcp/zone_a: %v", fan, err)
	}

	// Listeners: the view's (it asks for both; the fan is refused) and the site's.
	inView, inSite := &updates{}, &updates{}
	vcs := listenOn(t, d, "/mcp/zone_a", "2026-07-28", adminDemoToken, inView)
	for _, uri := range []string{fan, heater} {
		if err := vcs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: uri}); err != nil && !strings.Contains(err.Error(), "not in the view") {
			t.Fatal(err)
		}
	}
	scs := listenOn(t, d, "/mcp", "2026-07-28", adminDemoToken, inSite)
	if err := scs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: fan}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the listens are open
	site := connectAsPath(t, d, "/mcp", adminDemoToken)
	if !moveUntil(t, site, "http", func() bool { return inView.has(heater) && inSite.has(fan) }) {
		t.Fatalf("no updates to tell by: the view's listener got %v, the site's %v", inView.all(), inSite.all())
	}
	time.Sleep(2500 * time.Millisecond) // updates are one a second per resource, the last one trailing
	for _, u := range inView.all() {
		if u != heater {
			t.Errorf("a listener of /mcp/zone_a was told of %s", u)
		}
	}
}

// stdioRaw is physd over stdio spoken to line by line.
type stdioRaw struct {
	in    io.WriteCloser
	lines chan string
}

func startStdioRaw(t *testing.T, extra ...string) (*stdioRaw, *daemon) {
	t.Helper()
	args := append([]string{"run", "--manifest", greenhouse, "--state", t.TempDir(), "--stdio", "--view", "zone_a", "--http", "127.0.0.1:0", "--sim-control"}, extra...)
	d := &daemon{cmd: exec.Command(physdBin, args...), stderr: &syncBuffer{}, done: make(chan error, 1)}
	d.withPolicyToken(extra)
	d.cmd.Stderr = d.stderr
	in, err := d.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &stdioRaw{in: in, lines: make(chan string, 256)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
		d.done <- d.cmd.Wait()
	}()
	t.Cleanup(func() { in.Close(); d.stop(t) })
	d.addr = d.stderr.logValue(t, "listening", "addr")
	return r, d
}

// answer sends line and returns the answer with id, or the
// acknowledgement of a subscriptions/listen (one that was accepted).
func (r *stdioRaw) answer(t *testing.T, line string, id int) string {
	t.Helper()
	if _, err := io.WriteString(r.in, line+"\n"); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case l, ok := <-r.lines:
			if !ok {
				t.Fatal("physd closed stdout")
			}
			var m struct {
				ID     *int   `json:"id"`
				Method string `json:"method"`
			}
			if json.Unmarshal([]byte(l), &m) == nil && (m.ID != nil && *m.ID == id || m.Method == "notifications/subscriptions/acknowledged") {
				return l
			}
		case <-timeout:
			t.Fatalf("no answer to %s", line)
		}
	}
}

// TestViewsBoundarySubscriptionsStdio: over stdio with --view zone_a, a
// subscription to fan_zone_b (outside the view) is refused with the error
// its read gets in both eras (2025-11-25 resources/subscribe, 2026-07-28
// subscriptions/listen), and while the fan moves the stdio client is told
// of heater_zone_a only; the same daemon's HTTP endpoints judge a listen
// by their own view (/mcp/water refuses heater_zone_a, /mcp takes
// fan_zone_b), never by --view's.
func TestViewsBoundarySubscriptionsStdio(t *testing.T) {
	t.Parallel()
	fan, heater := "physmcp://obs/fan_zone_b", "physmcp://obs/heater_zone_a"

	// 2026-07-28, raw: the listen itself is refused.
	raw, rd := startStdioRaw(t, "--policy", greenhousePolicy)
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}}`
	readAns := raw.answer(t, `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{`+meta+`,"uri":"`+fan+`"}}`, 1)
	refusal := errorMessage(readAns)
	if !strings.Contains(refusal, `is not in the view "zone_a"`) {
		t.Fatalf("stdio read of %s: %s", fan, readAns)
	}
	for i, uris := range [][]string{{fan}, {heater, fan}} {
		got := raw.answer(t, listenBody(10+i, uris...), 10+i)
		if msg := errorMessage(got); msg != refusal {
			t.Errorf("stdio subscriptions/listen %v: %s (want the read's error %q)", uris, got, refusal)
		}
	}
	// The same daemon's HTTP endpoints judge a listen by their own view,
	// not by --view's.
	if got := rawListenHTTP(t, rd, "/mcp/water", adminDemoToken, heater); !strings.Contains(errorMessage(got), `is not in the view "water"`) {
		t.Errorf("subscriptions/listen %s through /mcp/water of a --view zone_a daemon: %s", heater, got)
	}
	if got := rawListenHTTP(t, rd, "/mcp", adminDemoToken, fan); !strings.Contains(got, "notifications/subscriptions/acknowledged") {
		t.Errorf("subscriptions/listen %s through /mcp of a --view zone_a daemon: %s", fan, got)
	}

	for _, era := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(era, func(t *testing.T) {
			t.Parallel()
			u := &updates{}
			cmd := exec.Command(physdBin, "run", "--manifest", greenhouse, "--state", t.TempDir(), "--stdio", "--view", "zone_a",
				"--http", "127.0.0.1:0", "--sim-control", "--policy", greenhousePolicy)
			stderr := &syncBuffer{}
			cmd.Stderr = stderr
			c := mcp.NewClient(&mcp.Implementation{Name: "views-boundary-e2e", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}, ResourceUpdatedHandler: u.add})
			cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: era})
			if err != nil {
				t.Fatalf("connect: %v\n%s", err, stderr.String())
			}
			t.Cleanup(func() { cs.Close() })
			d := &daemon{cmd: cmd, addr: stderr.logValue(t, "listening", "addr"), stderr: stderr, token: adminDemoToken}

			serr := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: fan})
			if era == "2025-11-25" && (serr == nil || !strings.Contains(serr.Error(), refusal)) {
				t.Errorf("resources/subscribe %s over stdio --view zone_a: %v (want %q)", fan, serr, refusal)
			}
			if err := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: heater}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			site := connectAsPath(t, d, "/mcp", adminDemoToken)
			if !moveUntil(t, site, "stdio-"+era, func() bool { return u.has(heater) }) {
				t.Fatalf("no update of %s over stdio: got %v", heater, u.all())
			}
			time.Sleep(2500 * time.Millisecond)
			for _, g := range u.all() {
				if g != heater {
					t.Errorf("stdio --view zone_a was told of %s", g)
				}
			}
		})
	}
}

// TestViewsBoundaryDocuments: through /mcp/zone_a, in both eras, the
// resources list, every document resource (policy, gate approval policy,
// views, manifest, alarms), the resource templates and completion name
// nothing outside the view; through /mcp/water the history template's
// example names no capability outside water.
func TestViewsBoundaryDocuments(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	ctx := context.Background()
	leaks := func(where, s string, outside []string) {
		t.Helper()
		for _, o := range outside {
			if i := strings.Index(s, o); i >= 0 {
				t.Errorf("%s names %s: …%s…", where, o, s[max(0, i-200):min(len(s), i+100)])
			}
		}
	}
	for _, era := range []string{"2026-07-28", "2025-11-25"} {
		cs := listenOn(t, d, "/mcp/zone_a", era, adminDemoToken, &updates{})
		rl, err := cs.ListResources(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		js, _ := json.Marshal(rl)
		leaks(era+" resources/list", string(js), outsideZoneA)
		var uris []string
		for _, r := range rl.Resources {
			if !strings.HasPrefix(r.URI, "physmcp://obs/") {
				uris = append(uris, r.URI)
			}
		}
		for _, want := range []string{"physmcp://policy", "phocinae://policy/gate-approval", "physmcp://views", "physmcp://manifest", "physmcp://alarms"} {
			if !strings.Contains(strings.Join(uris, " "), want) {
				t.Errorf("%s: resources/list through /mcp/zone_a lacks %s: %v", era, want, uris)
			}
		}
		for _, uri := range uris {
			res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
			if err != nil {
				t.Errorf("%s %s: %v", era, uri, err)
				continue
			}
			leaks(era+" "+uri, res.Contents[0].Text, outsideZoneA)
			if uri == "physmcp://policy" && !strings.Contains(res.Contents[0].Text, "do_heater_zone_a") {
				t.Errorf("%s: the policy through /mcp/zone_a lacks do_heater_zone_a:\n%s", era, res.Contents[0].Text)
			}
		}
		tl, err := cs.ListResourceTemplates(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		js, _ = json.Marshal(tl)
		leaks(era+" resources/templates/list", string(js), outsideZoneA)
		_, err = cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: "physmcp://history/{capability}{?since,until,step}"},
			Argument: mcp.CompleteParamsArgument{Name: "capability", Value: "fan"}})
		if err == nil {
			t.Errorf("%s: completion/complete answered through /mcp/zone_a", era)
		} else {
			leaks(era+" completion/complete", err.Error(), outsideZoneA)
		}

		water := listenOn(t, d, "/mcp/water", era, adminDemoToken, &updates{})
		wl, err := water.ListResourceTemplates(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		js, _ = json.Marshal(wl)
		leaks(era+" /mcp/water resources/templates/list", string(js), []string{"temperature_zone_a", "zone_b", "zone_c"})
	}
	// The whole site still shows all of it.
	site := connectAsPath(t, d, "/mcp", adminDemoToken)
	for _, uri := range []string{"physmcp://policy", "phocinae://policy/gate-approval", "physmcp://views"} {
		res, err := site.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil || !strings.Contains(res.Contents[0].Text, "fan_zone_b") && !strings.Contains(res.Contents[0].Text, "zone_b") {
			t.Errorf("%s through /mcp: %v", uri, err)
		}
	}
}
