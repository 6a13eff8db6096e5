package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/physd/physd/policy"
)

// checkExposure refuses a listener configuration that would expose
// bearer tokens or the equipment: run before anything is opened.
func checkExposure(f Config, token string) error {
	t := f.TLS
	if (t.Cert == "") != (t.Key == "") {
		return errors.New("--tls-cert and --tls-key go together: give both (the certificate and its private key) or neither")
	}
	if t.ClientCA != "" && t.Cert == "" {
		return errors.New("--tls-client-ca needs --tls-cert and --tls-key: client certificates are only asked for over TLS")
	}
	if t.InsecurePlainHTTP && t.Cert != "" {
		return errors.New("--insecure-plain-http contradicts --tls-cert: drop one of them")
	}
	return checkListen(f, token)
}

// httpSecurity is what the boundary and the listener need from the flags.
type httpSecurity struct {
	TLS                *tls.Config
	AllowedHosts       []string
	RequireCredentials bool
	scheme             string
}

// setupHTTPSecurity loads the certificates, checks that client
// certificates have a role mapping, and keeps the certificates fresh on
// SIGHUP until ctx ends. pol is the policy in force (nil without one).
func setupHTTPSecurity(ctx context.Context, f Config, pol *policy.Policy, log *slog.Logger) (httpSecurity, error) {
	t := f.TLS
	sec := httpSecurity{AllowedHosts: append([]string(nil), t.AllowedHosts...), scheme: "http",
		RequireCredentials: !isLoopback(f.HTTPAddr) || t.ClientCA != ""}
	if host, _, err := net.SplitHostPort(f.HTTPAddr); err == nil && host != "" {
		if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
			sec.AllowedHosts = append(sec.AllowedHosts, host) // --http gw1.plant.example:8443
		}
	}
	mapped := pol != nil && len(pol.Identity.MTLS) > 0
	switch {
	case t.ClientCA != "" && !mapped:
		return sec, fmt.Errorf("--tls-client-ca %s: physd would verify client certificates but no policy maps them to roles; "+
			"fix: add to --policy  identity: {providers: [{type: mtls, clients: [{cn: <subject CN>, role: operator}]}]}", t.ClientCA)
	case t.ClientCA == "" && mapped:
		return sec, fmt.Errorf("policy %s maps client certificates (identity.providers type mtls) but physd does not ask for them; "+
			"fix: pass --tls-client-ca FILE with --tls-cert and --tls-key", pol.Path)
	}
	if !isLoopback(f.HTTPAddr) && t.InsecurePlainHTTP {
		log.Warn("plain HTTP on a non-loopback address (--insecure-plain-http): bearer tokens and every value cross the network in the clear; "+
			"use --tls-cert/--tls-key unless a TLS-terminating proxy or an isolated network protects this link", "addr", f.HTTPAddr)
	}
	if t.Cert == "" {
		return sec, nil
	}
	cs := &certStore{certFile: t.Cert, keyFile: t.Key, caFile: t.ClientCA}
	if err := cs.load(time.Now()); err != nil {
		return sec, err
	}
	leaf := cs.cert.Load().Leaf
	sec.AllowedHosts = append(sec.AllowedHosts, leaf.DNSNames...)
	for _, ip := range leaf.IPAddresses {
		sec.AllowedHosts = append(sec.AllowedHosts, ip.String())
	}
	sec.TLS, sec.scheme = cs.config(), "https"
	log.Info("TLS", "cert", t.Cert, "subject", leaf.Subject.CommonName, "not_after", leaf.NotAfter.UTC(), "client_ca", t.ClientCA)
	go cs.reloadOnHUP(ctx, log)
	return sec, nil
}

// certStore holds the serving certificate and the client CA pool; both are
// swapped atomically on reload, so the listener and its open connections
// stay up and new handshakes see the new files.
type certStore struct {
	certFile, keyFile, caFile string
	cert                      atomic.Pointer[tls.Certificate]
	clientCAs                 atomic.Pointer[x509.CertPool]
}

// modernSuites are the TLS 1.2 suites physd offers: forward-secret AEAD
// only. TLS 1.3 suites are not configurable and are all modern.
var modernSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// load reads every file and swaps them in only if all are good.
func (c *certStore) load(now time.Time) error {
	kp, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err := c.unreadable(err); err != nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("--tls-cert %s / --tls-key %s: %w; fix: a PEM certificate (leaf first, then intermediates) and the PEM private key it was issued for", c.certFile, c.keyFile, err)
	}
	if now.After(kp.Leaf.NotAfter) {
		return fmt.Errorf("--tls-cert %s expired on %s; fix: install a renewed certificate and send SIGHUP", c.certFile, kp.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	var pool *x509.CertPool
	if c.caFile != "" {
		b, err := os.ReadFile(c.caFile)
		if err := c.unreadable(err); err != nil {
			return err
		}
		if err != nil {
			return fmt.Errorf("--tls-client-ca %s: %w", c.caFile, err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return fmt.Errorf("--tls-client-ca %s holds no PEM certificate; fix: the CA certificate(s) that issue client certificates, PEM-encoded", c.caFile)
		}
	}
	c.cert.Store(&kp)
	c.clientCAs.Store(pool)
	return nil
}

// unreadable names the flag of a file that could not be read (nil for
// any other error, or none): "open x.pem: no such file" alone does not
// say which of the three flags to fix.
func (c *certStore) unreadable(err error) error {
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		return nil
	}
	flag := map[string]string{c.certFile: "--tls-cert", c.keyFile: "--tls-key", c.caFile: "--tls-client-ca"}[pe.Path]
	if flag == "" {
		return nil
	}
	return fmt.Errorf("%s %s: cannot read it (%v); fix: give the path of the PEM file, readable by the user physd runs as", flag, pe.Path, pe.Err)
}

// config is the listener's TLS configuration: TLS 1.2 or later with
// modern suites, the current certificate per handshake and, with a client
// CA, optional client certificates verified against the current pool (a
// caller without one may still present a token).
func (c *certStore) config() *tls.Config {
	base := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		CipherSuites: modernSuites,
		NextProtos:   []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cert.Load(), nil
		},
	}
	if c.caFile == "" {
		return base
	}
	base.ClientAuth = tls.VerifyClientCertIfGiven
	base.ClientCAs = c.clientCAs.Load()
	perHandshake := base.Clone()
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cfg := perHandshake.Clone()
		cfg.ClientCAs = c.clientCAs.Load()
		return cfg, nil
	}
	return base
}

// reloadOnHUP re-reads the certificate, key and client CA on SIGHUP. A bad
// set is rejected and the running one stays in force.
func (c *certStore) reloadOnHUP(ctx context.Context, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if err := c.load(time.Now()); err != nil {
			log.Error("TLS reload rejected; the running certificate stays in force", "err", err.Error())
			continue
		}
		leaf := c.cert.Load().Leaf
		log.Info("TLS certificate reloaded", "subject", leaf.Subject.CommonName, "serial", leaf.SerialNumber.Text(16), "not_after", leaf.NotAfter.UTC())
	}
}
