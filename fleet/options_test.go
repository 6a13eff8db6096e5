package fleet

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/internal/natstest"
	"github.com/physd/physd/internal/testpki"
	"github.com/physd/physd/manifest"
)

// TestOptionsNKeyAndMutualTLS: a gateway authenticated by an NKey seed
// file over TLS with a client certificate (the hub requires and verifies
// it) publishes its audit; the files are read through Options, as the
// daemon does.
func TestOptionsNKeyAndMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := testpki.NewCA("hub-ca")
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := ca.Server()
	srvCert, err := srv.TLS()
	if err != nil {
		t.Fatal(err)
	}
	cli, _ := ca.Client("gw_1")
	certPath, keyPath, err := cli.WriteFiles(dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	caPath := filepath.Join(dir, "ca.pem")
	if err := ca.WriteFile(caPath); err != nil {
		t.Fatal(err)
	}
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedPath := filepath.Join(dir, "gw.nk")
	if err := os.WriteFile(seedPath, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	h := natstest.StartWith(t, t.TempDir(), func(o *server.Options) {
		o.Nkeys = []*server.NkeyUser{{Nkey: pub, Permissions: natstest.SitePermissions("physd", "north", stream)}}
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{srvCert}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
		o.TLS, o.TLSVerify, o.TLSTimeout = true, true, 2
	})
	_, js := admin(t, h, nats.RootCAs(caPath), nats.ClientCert(certPath, keyPath))
	createStream(t, js)

	f := &manifest.Fleet{Enabled: true, URLs: []string{h.URL()}, Site: "north", NKeySeedFile: seedPath,
		TLSCA: caPath, TLSCert: certPath, TLSKey: keyPath, Stream: stream, SubjectPrefix: "physd",
		ConnectTimeoutMS: 2000, PublishTimeoutMS: 2000}
	opts, err := Options(f)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	appendN(t, al, 5)
	u, err := New(Config{URLs: f.URLs, Site: "north", DeviceID: "gw_1", Stream: stream, Prefix: "physd", Options: opts,
		ConnectTimeout: time.Second, PublishTimeout: 2 * time.Second, ReconnectWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	u.Start(al)
	defer u.Close()
	waitFor(t, "5 records over TLS with the NKey", 10*time.Second, func() bool { return u.Stats().Cursor == 5 })
	same(t, streamRecords(t, js, u.AuditSubject()), localRecords(t, al))
}

func TestOptionsFileErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	for _, tc := range []struct {
		f    manifest.Fleet
		want string
	}{
		{manifest.Fleet{CredentialsFile: filepath.Join(dir, "none.creds")}, "network.fleet.credentials_file"},
		{manifest.Fleet{NKeySeedFile: filepath.Join(dir, "none.nk")}, "network.fleet.nkey_seed_file"},
		{manifest.Fleet{User: "u", PasswordFile: filepath.Join(dir, "none.pw")}, "network.fleet.password_file"},
		{manifest.Fleet{URLs: []string{"tls://h:4222"}, TLSCA: notPEM}, "holds no PEM certificate"},
		{manifest.Fleet{URLs: []string{"tls://h:4222"}, TLSCert: notPEM, TLSKey: notPEM}, "network.fleet.tls.cert/key"},
	} {
		if _, err := Options(&tc.f); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %s", tc.f, err, tc.want)
		}
	}
}
