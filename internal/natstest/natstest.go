// Package natstest runs a real NATS server with JetStream (nats-server
// embedded in the test process) for the fleet uplink's tests: per-site
// users whose permissions confine them to their site's subjects, an
// admin, and a stop/start on the same port and store (a WAN cut).
package natstest

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/hub"
)

// Hub is one nats-server.
type Hub struct {
	t    testing.TB
	opts server.Options
	S    *server.Server
}

// Admin is the user name (and password) of the hub's operator.
const Admin = "admin"

// SiteUser is a gateway's user with the permissions a hub gives a site
// (hub.SitePermissions, no JetStream domain): its own subjects, the
// cursors on each of streams, its own requests and the replies to them;
// nothing else.
func SiteUser(name, password, prefix, site string, streams ...string) *server.User {
	return &server.User{Username: name, Password: password, Permissions: SitePermissions(prefix, site, streams...)}
}

// Start runs a hub with JetStream in dir on a free loopback port.
func Start(t testing.TB, dir string, users ...*server.User) *Hub {
	t.Helper()
	return StartWith(t, dir, nil, users...)
}

// StartWith is Start with the server's options adjusted by tune (NKey
// users, TLS) before it starts.
func StartWith(t testing.TB, dir string, tune func(*server.Options), users ...*server.User) *Hub {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	users = append(users, &server.User{Username: Admin, Password: Admin})
	h := &Hub{t: t, opts: server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, Users: users,
		NoSigs: true, NoLog: true, MaxControlLine: 4096}}
	if tune != nil {
		tune(&h.opts)
	}
	h.Start()
	t.Cleanup(h.Stop)
	return h
}

// URL is the hub's nats:// URL (tls:// when it runs TLS).
func (h *Hub) URL() string {
	if h.opts.TLSConfig != nil {
		return fmt.Sprintf("tls://127.0.0.1:%d", h.opts.Port)
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", h.opts.Port)
}

// SitePermissions are hub.SitePermissions in nats-server's terms (for a
// user or an NKey user).
func SitePermissions(prefix, site string, streams ...string) *server.Permissions {
	return ServerPermissions(hub.SitePermissions(prefix, site, "", streams...))
}

// FleetUser is the fleet endpoint's user with hub.FleetPermissions (no
// JetStream domain).
func FleetUser(name, password, prefix string, streams hub.FleetStreams) *server.User {
	return &server.User{Username: name, Password: password, Permissions: ServerPermissions(hub.FleetPermissions(prefix, "", streams))}
}

// ServerPermissions are p in nats-server's terms (the embedded hub's own
// conversion is left out of a -tags nohub build; this package is for
// tests and always links nats-server).
func ServerPermissions(p hub.Permissions) *server.Permissions {
	return &server.Permissions{Publish: &server.SubjectPermission{Allow: p.Publish}, Subscribe: &server.SubjectPermission{Allow: p.Subscribe}}
}

// Start (re)starts a stopped hub on its port and store.
func (h *Hub) Start() {
	h.t.Helper()
	o := h.opts
	s, err := server.NewServer(&o)
	if err != nil {
		h.t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		h.t.Fatal("nats-server not ready in 10 s")
	}
	h.S = s
}

// Stop shuts the hub down (the WAN cut); Start brings it back.
func (h *Hub) Stop() {
	if h.S != nil {
		h.S.Shutdown()
		h.S.WaitForShutdown()
		h.S = nil
	}
}

// Connect is a connection to url as the hub's operator (user and
// password Admin, no permissions) and its JetStream, closed when the test
// ends.
func Connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return Open(t, url, append(opts, nats.UserInfo(Admin, Admin))...)
}

// Open is a connection to url with opts alone (the user they name) and its
// JetStream, closed when the test ends.
func Open(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// Watched is a connection that keeps the server's asynchronous errors
// (its permissions violations): a test of what a user may not do watches
// for the server's refusal of each attempt.
type Watched struct {
	Conn *nats.Conn
	mu   sync.Mutex
	errs []string
}

// Watch connects to url with opts and keeps the server's errors; the
// connection is closed when the test ends.
func Watch(t testing.TB, url string, opts ...nats.Option) *Watched {
	t.Helper()
	w := &Watched{}
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		w.mu.Lock()
		w.errs = append(w.errs, err.Error())
		w.mu.Unlock()
	}))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	w.Conn = nc
	return w
}

// Errors are the server's errors so far.
func (w *Watched) Errors() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string{}, w.errs...)
}

// Refused waits up to 5 s for the server's permissions violation of
// what ("Publish to", "Subscription to") on subject, and fails the test
// without it.
func (w *Watched) Refused(t testing.TB, what, subject string) {
	t.Helper()
	want := strings.ToLower("Permissions Violation for " + what + ` "` + subject + `"`)
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		errs := w.Errors()
		if strings.Contains(strings.ToLower(strings.Join(errs, "\n")), want) {
			return
		}
		if time.Now().After(end) {
			t.Errorf("no permissions violation for %s %q; the server said %v", what, subject, errs)
			return
		}
	}
}

// Clean fails the test if the server refused anything: what the
// permissions allow must not be refused.
func (w *Watched) Clean(t testing.TB) {
	t.Helper()
	_ = w.Conn.Flush()
	time.Sleep(100 * time.Millisecond) // a violation arrives right after the flush's PONG
	if errs := w.Errors(); len(errs) > 0 {
		t.Errorf("the server refused what the permissions allow: %v", errs)
	}
}
