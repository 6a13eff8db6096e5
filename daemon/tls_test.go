package daemon

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/internal/testpki"
)

// tlsServer accepts TLS connections with cfg and completes each handshake.
func tlsServer(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if c.(*tls.Conn).Handshake() == nil {
					_, _ = c.Write([]byte("k")) // the client knows the handshake passed
					_, _ = c.Read(make([]byte, 1))
				}
			}()
		}
	}()
	return l.Addr().String()
}

func writeLeaf(t *testing.T, l *testpki.Leaf, dir, name string) (string, string) {
	t.Helper()
	c, k, err := l.WriteFiles(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

func mustCA(t *testing.T, name string) *testpki.CA {
	t.Helper()
	ca, err := testpki.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustServer(t *testing.T, ca *testpki.CA) *testpki.Leaf {
	t.Helper()
	l, err := ca.Server()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestTLSVersionsAndSuites: TLS 1.2 with a forward-secret AEAD suite and
// TLS 1.3 connect; TLS 1.1 and TLS 1.2 with CBC or RSA key exchange do not.
func TestTLSVersionsAndSuites(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, "site")
	cert, key := writeLeaf(t, mustServer(t, ca), dir, "server")
	cs := &certStore{certFile: cert, keyFile: key}
	if err := cs.load(time.Now()); err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, cs.config())
	for _, c := range []struct {
		name string
		cfg  *tls.Config
		ok   bool
	}{
		{"TLS 1.3", &tls.Config{MinVersion: tls.VersionTLS13}, true},
		{"TLS 1.2 ECDHE-GCM", &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}}, true},
		{"TLS 1.2 ChaCha20", &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256}}, true},
		{"TLS 1.2 ECDHE-CBC", &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA}}, false},
		{"TLS 1.2 RSA key exchange", &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_RSA_WITH_AES_128_GCM_SHA256}}, false},
		{"TLS 1.1", &tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}, false},
	} {
		cfg := c.cfg
		cfg.RootCAs, cfg.ServerName = ca.Pool(), "localhost"
		conn, err := tls.Dial("tcp", addr, cfg)
		if err == nil {
			conn.Close()
		}
		if (err == nil) != c.ok {
			t.Errorf("%s: err=%v, want ok=%v", c.name, err, c.ok)
		}
	}
}

func serialSeen(t *testing.T, addr string, cfg *tls.Config) (string, error) {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Text(16), nil
}

// TestCertReload: a reload swaps the certificate for new handshakes on the
// same listener; a bad or expired set is refused and the running one
// stays; the client CA pool is swapped the same way.
func TestCertReload(t *testing.T) {
	dir := t.TempDir()
	ca, ca2 := mustCA(t, "site"), mustCA(t, "new site CA")
	first, second := mustServer(t, ca), mustServer(t, ca)
	cert, key := writeLeaf(t, first, dir, "server")
	caFile := filepath.Join(dir, "clients.pem")
	if err := ca.WriteFile(caFile); err != nil {
		t.Fatal(err)
	}
	cs := &certStore{certFile: cert, keyFile: key, caFile: caFile}
	if err := cs.load(time.Now()); err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, cs.config())
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
	if s, err := serialSeen(t, addr, client); err != nil || s != first.Cert.SerialNumber.Text(16) {
		t.Fatalf("before reload: %s %v", s, err)
	}

	writeLeaf(t, second, dir, "server")
	if err := cs.load(time.Now()); err != nil {
		t.Fatal(err)
	}
	if s, err := serialSeen(t, addr, client); err != nil || s != second.Cert.SerialNumber.Text(16) {
		t.Errorf("after reload: %s %v, want the new certificate", s, err)
	}

	// A key that does not belong to the certificate, and an expired
	// certificate, are refused; the second certificate stays in force.
	other := mustServer(t, ca)
	os.WriteFile(key, other.KeyPEM, 0o600)
	if err := cs.load(time.Now()); err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Errorf("mismatched key: %v", err)
	}
	writeLeaf(t, second, dir, "server")
	if err := cs.load(time.Now().Add(48 * time.Hour)); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired certificate: %v", err)
	}
	if s, err := serialSeen(t, addr, client); err != nil || s != second.Cert.SerialNumber.Text(16) {
		t.Errorf("after rejected reloads: %s %v, want the second certificate still", s, err)
	}

	// The client CA: a certificate of the new CA is refused until the CA
	// file names it.
	leaf, err := ca2.Client("ops")
	if err != nil {
		t.Fatal(err)
	}
	cc, err := leaf.TLS()
	if err != nil {
		t.Fatal(err)
	}
	// GetClientCertificate sends the certificate even when the server does
	// not list its CA (a Go client would otherwise send none).
	withCert := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cc, nil }}
	handshake := func() error {
		conn, err := tls.Dial("tcp", addr, withCert)
		if err != nil {
			return err
		}
		defer conn.Close()
		// TLS 1.3 reports a refused client certificate on the first read;
		// the server writes one byte once the handshake passed.
		_, err = conn.Read(make([]byte, 1))
		return err
	}
	if err := handshake(); err == nil {
		t.Error("a client certificate of an untrusted CA was accepted")
	}
	if err := ca2.WriteFile(caFile); err != nil {
		t.Fatal(err)
	}
	if err := cs.load(time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := handshake(); err != nil {
		t.Errorf("after the client CA reload: %v", err)
	}
}
