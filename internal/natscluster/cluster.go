package natscluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/hub"
	"github.com/physd/physd/internal/natstest"
)

// Admin is the user name and password of the hub's operator (no
// permissions: it creates the streams and reads them).
const Admin = natstest.Admin

// User is a user of a server: the hub's (a site's leaf connects with
// one) or a leaf's local one (a gateway connects with it).
type User struct {
	Name, Password string
	// Publish and Subscribe are the subjects it may publish and
	// subscribe to; nil allows everything.
	Publish, Subscribe []string
}

// SiteUser is a site's user on the hub: its leaf connects with it, and
// the hub applies these permissions to everything the leaf forwards
// (hub.SitePermissions in domain's API): publish under prefix.site. only,
// the JetStream API requests of the uplink's cursors on each stream, the
// fleet endpoint's requests to the site's gateways and one answer each.
func SiteUser(name, password, prefix, site, domain string, streams ...string) User {
	return userOf(name, password, hub.SitePermissions(prefix, site, domain, streams...))
}

// FleetUser is the fleet endpoint's user on the hub (hub.FleetPermissions
// in domain's API).
func FleetUser(name, password, prefix, domain string, streams hub.FleetStreams) User {
	return userOf(name, password, hub.FleetPermissions(prefix, domain, streams))
}

func userOf(name, password string, p hub.Permissions) User {
	return User{Name: name, Password: password, Publish: p.Publish, Subscribe: p.Subscribe}
}

// HubOptions shape a hub.
type HubOptions struct {
	// Servers in the cluster: 1, or 3 (the default; a stream with three
	// replicas survives one server's loss).
	Servers int
	// Domain is the hub's JetStream domain (default "hub"): a client at a
	// leaf addresses the hub's JetStream API as $JS.<domain>.API.
	Domain string
	// Users besides Admin.
	Users []User
	// LeafPing is how often the hub and its leaves ping each other (a dead
	// link is noticed after two unanswered pings); default 500 ms.
	LeafPing time.Duration
}

// Hub is a cluster of nats-server processes with JetStream.
type Hub struct {
	t       testing.TB
	opts    HubOptions
	Servers []*Server
}

// Server is one nats-server process: its generated configuration file,
// store and log live in its directory; its ports stay across restarts.
type Server struct {
	t      testing.TB
	Name   string
	Dir    string
	Client int // client port
	HTTP   int // monitoring port
	Route  int // cluster port (hub servers)
	Leaf   int // leaf node port (hub servers)
	Conf   string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartHub runs a hub and waits until its JetStream is ready. The
// processes are killed when the test ends.
func StartHub(t testing.TB, o HubOptions) *Hub {
	t.Helper()
	if o.Servers <= 0 {
		o.Servers = 3
	}
	if o.Domain == "" {
		o.Domain = "hub"
	}
	if o.LeafPing <= 0 {
		o.LeafPing = 500 * time.Millisecond
	}
	dir := t.TempDir()
	h := &Hub{t: t, opts: o}
	for i := range o.Servers {
		s := &Server{t: t, Name: fmt.Sprintf("hub-%d", i+1), Dir: filepath.Join(dir, fmt.Sprintf("hub-%d", i+1)),
			Client: freePort(t), HTTP: freePort(t), Route: freePort(t), Leaf: freePort(t)}
		h.Servers = append(h.Servers, s)
	}
	for _, s := range h.Servers {
		s.Conf = filepath.Join(s.Dir, "hub.conf")
		if err := os.MkdirAll(s.Dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(s.Conf, []byte(h.config(s).String()), 0o600); err != nil {
			t.Fatal(err)
		}
		s.start()
	}
	t.Cleanup(func() {
		for _, s := range h.Servers {
			s.kill()
		}
		if t.Failed() {
			for _, s := range h.Servers {
				s.logTail()
			}
		}
	})
	for _, s := range h.Servers {
		s.WaitHealthy(30 * time.Second)
	}
	return h
}

// config is a hub server's configuration file.
func (h *Hub) config(s *Server) block {
	var routes []string
	for _, o := range h.Servers {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.Route))
	}
	c := block{
		{"server_name", s.Name},
		{"host", "127.0.0.1"},
		{"port", s.Client},
		{"http", fmt.Sprintf("127.0.0.1:%d", s.HTTP)},
		{"jetstream", block{{"store_dir", filepath.Join(s.Dir, "store")}, {"domain", h.opts.Domain}}},
	}
	if len(h.Servers) > 1 {
		c = append(c, kv{"cluster", block{
			{"name", "hub"},
			{"host", "127.0.0.1"},
			{"port", s.Route},
			{"routes", routes},
			// The leaves reach the hub through their links (proxies) only:
			// servers do not tell clients and leaves of each other.
			{"no_advertise", true},
		}})
	}
	c = append(c,
		kv{"leafnodes", block{
			{"host", "127.0.0.1"},
			{"port", s.Leaf},
			{"no_advertise", true},
			{"ping_interval", h.opts.LeafPing.String()},
			{"ping_max", 2},
		}},
		kv{"authorization", block{{"users", users(append([]User{{Name: Admin, Password: Admin}}, h.opts.Users...))}}},
	)
	return c
}

func users(us []User) []block {
	var out []block
	for _, u := range us {
		b := block{{"user", u.Name}, {"password", u.Password}}
		if u.Publish != nil || u.Subscribe != nil {
			var p block
			if u.Publish != nil {
				p = append(p, kv{"publish", block{{"allow", u.Publish}}})
			}
			if u.Subscribe != nil {
				p = append(p, kv{"subscribe", block{{"allow", u.Subscribe}}})
			}
			b = append(b, kv{"permissions", p})
		}
		out = append(out, b)
	}
	return out
}

// URLs are the hub's client URLs (the operator's, not the sites').
func (h *Hub) URLs() []string {
	var out []string
	for _, s := range h.Servers {
		out = append(out, s.URL())
	}
	return out
}

// URL is every client URL, comma-separated (nats.Connect's form).
func (h *Hub) URL() string { return strings.Join(h.URLs(), ",") }

// Domain is the hub's JetStream domain.
func (h *Hub) Domain() string { return h.opts.Domain }

// LeafOptions shape a site's leaf node.
type LeafOptions struct {
	// Site names the leaf (leaf-<site>).
	Site string
	// User and Password are the site's credentials on the hub (a
	// SiteUser): the hub applies their permissions to the leaf link.
	User, Password string
	// Local are the users the site's gateways connect with; none: the
	// leaf takes anonymous connections (loopback only).
	Local []User
	// JetStreamDomain runs JetStream on the leaf too, in this domain (the
	// hub's is then reachable only by its domain's API prefix).
	JetStreamDomain string
	// Reconnect is how often the leaf dials the hub after the link
	// failed (default 250 ms).
	Reconnect time.Duration
}

// Leaf is a site's leaf node; Link is its WAN: one proxy per hub server,
// cut, stalled, slowed and healed together.
type Leaf struct {
	*Server
	Link *Link
}

// StartLeaf runs a site's leaf node, connected to every hub server
// through the site's link, and waits until it is ready (not until the
// link is up: WaitLinked).
func (h *Hub) StartLeaf(t testing.TB, o LeafOptions) *Leaf {
	t.Helper()
	if o.Reconnect <= 0 {
		o.Reconnect = 250 * time.Millisecond
	}
	s := &Server{t: t, Name: "leaf-" + o.Site, Dir: filepath.Join(t.TempDir(), "leaf-"+o.Site), Client: freePort(t), HTTP: freePort(t)}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	link := &Link{}
	var remotes []string
	for _, hs := range h.Servers {
		p := NewProxy(t, fmt.Sprintf("127.0.0.1:%d", hs.Leaf))
		link.Proxies = append(link.Proxies, p)
		u := url.URL{Scheme: "nats-leaf", Host: p.Addr(), User: url.UserPassword(o.User, o.Password)}
		remotes = append(remotes, u.String())
	}
	c := block{
		{"server_name", s.Name},
		{"host", "127.0.0.1"},
		{"port", s.Client},
		{"http", fmt.Sprintf("127.0.0.1:%d", s.HTTP)},
	}
	if o.JetStreamDomain != "" {
		c = append(c, kv{"jetstream", block{{"store_dir", filepath.Join(s.Dir, "store")}, {"domain", o.JetStreamDomain}}})
	}
	c = append(c, kv{"leafnodes", block{
		{"reconnect", o.Reconnect.String()},
		{"ping_interval", h.opts.LeafPing.String()},
		{"ping_max", 2},
		{"remotes", []block{{{"urls", remotes}}}},
	}})
	if len(o.Local) > 0 {
		c = append(c, kv{"authorization", block{{"users", users(o.Local)}}})
	}
	s.Conf = filepath.Join(s.Dir, "leaf.conf")
	if err := os.WriteFile(s.Conf, []byte(c.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	s.start()
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			s.logTail()
		}
	})
	s.WaitHealthy(30 * time.Second)
	return &Leaf{Server: s, Link: link}
}

// Linked reports whether the leaf has a connection to the hub (its
// /leafz monitoring endpoint).
func (l *Leaf) Linked() bool {
	var lz struct {
		Leafs []json.RawMessage `json:"leafs"`
	}
	return l.getJSON("/leafz", &lz) == nil && len(lz.Leafs) > 0
}

// WaitLinked waits until the leaf is connected to the hub.
func (l *Leaf) WaitLinked(d time.Duration) {
	l.t.Helper()
	end := time.Now().Add(d)
	for !l.Linked() {
		if time.Now().After(end) {
			l.t.Fatalf("%s: no link to the hub after %s", l.Name, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Link is a site's WAN: one proxy per hub server.
type Link struct{ Proxies []*Proxy }

// Cut closes the link's connections and leaves new ones silent until
// Heal.
func (k *Link) Cut() {
	for _, p := range k.Proxies {
		p.Cut()
	}
}

// Stall holds every byte until Heal.
func (k *Link) Stall() {
	for _, p := range k.Proxies {
		p.Stall()
	}
}

// Heal ends a cut or a stall.
func (k *Link) Heal() {
	for _, p := range k.Proxies {
		p.Heal()
	}
}

// SetDelay delays each direction by d (a round trip of 2d).
func (k *Link) SetDelay(d time.Duration) {
	for _, p := range k.Proxies {
		p.SetDelay(d)
	}
}

// URL is the server's client URL.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.Client) }

func (s *Server) start() {
	s.t.Helper()
	logf, err := os.OpenFile(filepath.Join(s.Dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(Binary(s.t), "-c", s.Conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
}

// Kill SIGKILLs the server (no shutdown: what a power cut does).
func (s *Server) Kill() { s.kill() }

func (s *Server) kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Restart starts a killed server again on its ports and store, and
// waits until it is healthy.
func (s *Server) Restart() {
	s.t.Helper()
	s.kill()
	s.start()
	s.WaitHealthy(30 * time.Second)
}

// Running reports whether the process is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// WaitHealthy waits until the server's /healthz answers 200 (for a
// JetStream server: its JetStream is current).
func (s *Server) WaitHealthy(d time.Duration) {
	s.t.Helper()
	end := time.Now().Add(d)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", s.HTTP))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if !s.Running() {
			s.logTail()
			s.t.Fatalf("%s exited", s.Name)
		}
		if time.Now().After(end) {
			s.logTail()
			s.t.Fatalf("%s not healthy after %s: %v", s.Name, d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) getJSON(path string, v any) error {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", s.HTTP, path))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// Log is the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "server.log"))
	return string(b)
}

// logTail logs the end of the server's log (on a failed test).
func (s *Server) logTail() {
	f, err := os.Open(filepath.Join(s.Dir, "server.log"))
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 40 {
			lines = lines[1:]
		}
	}
	s.t.Logf("%s: the end of its log:\n%s", s.Name, strings.Join(lines, "\n"))
}

// freePort is a loopback port free now (another process may take it
// before the server binds it; the server then fails to start, loudly).
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Admin is a connection of the hub's operator (every server's URL, so it
// survives one server's death) and its JetStream, closed when the test
// ends.
func (h *Hub) Admin(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return natstest.Connect(t, h.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
}

// CreateStream creates a stream, trying again for a while: a cluster
// that just started elects its JetStream meta leader first.
func CreateStream(t testing.TB, js jetstream.JetStream, cfg jetstream.StreamConfig) {
	t.Helper()
	end := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := js.CreateStream(ctx, cfg)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("stream %s: %v", cfg.Name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
