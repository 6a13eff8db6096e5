package fleetd

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/physd/physd/hub"
	"github.com/physd/physd/internal/natstest"
	"github.com/physd/physd/manifest"
)

// TestEndpointInDomain: an endpoint whose user's permissions name the
// hub's JetStream domain (hub.FleetPermissions in "hub") makes sure of
// its streams and reads the catalogs through $JS.hub.API.
func TestEndpointInDomain(t *testing.T) {
	fleetPerms := natstest.ServerPermissions(hub.FleetPermissions("physd", "hub", testStreams))
	h := natstest.StartWith(t, t.TempDir(), func(o *server.Options) { o.JetStreamDomain = "hub" },
		&server.User{Username: fleetUser, Password: fleetUser + "-pw", Permissions: fleetPerms})
	pw := filepath.Join(t.TempDir(), "fleet.pw")
	if err := os.WriteFile(pw, []byte(fleetUser+"-pw"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &Config{ID: "fleet_test", Replicas: 1, CallTimeout: 500 * time.Millisecond, ReadTimeout: 2 * time.Second, DoTimeout: 5 * time.Second, ConnectTimeout: time.Second,
		NATS: &NATS{URLs: []string{h.URL()}, Domain: "hub", Fleet: manifest.Fleet{URLs: []string{h.URL()}, User: fleetUser, PasswordFile: pw}}}
	e := New(cfg, nil)
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.loaded:
	case <-time.After(10 * time.Second):
		e.mu.Lock()
		defer e.mu.Unlock()
		t.Fatalf("the endpoint did not read the catalogs in the domain: %s", e.streamErr)
	}
}
