package opcua

import (
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/strictyaml"
)

// busKeys are the keys of an opcua bus entry. Pointers tell "absent" from
// a zero value.
type busKeys struct {
	Endpoint          *string  `yaml:"endpoint"`
	SecurityPolicy    *string  `yaml:"security_policy"`
	SecurityMode      *string  `yaml:"security_mode"`
	Certificate       *string  `yaml:"certificate"`
	PrivateKey        *string  `yaml:"private_key"`
	ServerCertificate *string  `yaml:"server_certificate"`
	ServerTrust       []string `yaml:"server_trust"`
	ApplicationURI    *string  `yaml:"application_uri"`
	Username          *string  `yaml:"username"`
	PasswordEnv       *string  `yaml:"password_env"`
	UserCertificate   *string  `yaml:"user_certificate"`
	UserPrivateKey    *string  `yaml:"user_private_key"`
	TimeoutMS         *int     `yaml:"timeout_ms"`
	ConnectTimeoutMS  *int     `yaml:"connect_timeout_ms"`
	ReconnectMS       *int     `yaml:"reconnect_backoff_ms"`
	KeepAliveMS       *int     `yaml:"keepalive_ms"`
}

// Security policies and modes this driver speaks (OPC UA Part 7 names).
const (
	PolicyNone           = "None"
	PolicyBasic256Sha256 = "Basic256Sha256"
	PolicyAes128         = "Aes128_Sha256_RsaOaep"
	PolicyAes256         = "Aes256_Sha256_RsaPss"
	ModeNone             = "None"
	ModeSign             = "Sign"
	ModeSignAndEncrypt   = "SignAndEncrypt"
)

var (
	policies = []string{PolicyNone, PolicyBasic256Sha256, PolicyAes128, PolicyAes256}
	modes    = []string{ModeNone, ModeSign, ModeSignAndEncrypt}
)

// Config is every setting of an opcua bus. DefaultConfig holds the
// defaults, each with its reason.
type Config struct {
	Endpoint       string        // endpoint: opc.tcp://host:port/path
	Policy         string        // security_policy: None, Basic256Sha256, Aes128_Sha256_RsaOaep or Aes256_Sha256_RsaPss
	Mode           string        // security_mode: None, Sign or SignAndEncrypt
	Timeout        time.Duration // timeout_ms: the wait for one service reply (bounded again by the capability's timeout)
	ConnectTimeout time.Duration // connect_timeout_ms: the bound on one connect (channel, session, namespace table)
	Reconnect      time.Duration // reconnect_backoff_ms: the least time between two connect attempts after a failure
	// KeepAlive (keepalive_ms) is how often a subscription with nothing
	// to report says it is alive, and the longest publishing interval: a
	// lost subscription is noticed within keepalive_ms + one publishing
	// interval (at most keepalive_ms) + timeout_ms, and
	// a change within keepalive_ms of the sample that saw it.
	KeepAlive time.Duration

	// The application instance certificate and its key (DER), for
	// a security policy; generated at open when not given.
	CertFile, KeyFile string
	cert              []byte
	key               *rsa.PrivateKey
	ApplicationURI    string // application_uri: the URI in the certificate's SAN

	// ServerCertFile is the server certificate physd pins (server_certificate):
	// a server that presents another is refused before any session.
	ServerCertFile string
	serverCert     []byte
	// ServerTrust are the certificates (CAs, or servers' own self-signed
	// ones) a server certificate must chain to when none is pinned
	// (server_trust).
	ServerTrust []string
	trust       *x509.CertPool

	Username    string // username: user/password identity (else anonymous)
	PasswordEnv string // password_env: the environment variable holding the password

	// UserCertFile and UserKeyFile are an X.509 user identity
	// (user_certificate, user_private_key), instead of a user name.
	UserCertFile, UserKeyFile string
	userCert                  []byte
	userKey                   *rsa.PrivateKey
}

// DefaultConfig is an opcua bus with every key but endpoint left out.
func DefaultConfig() Config {
	return Config{
		Policy: PolicyNone,
		Mode:   ModeNone,
		// A server on the LAN answers a Read in milliseconds; two
		// seconds covers a busy server or an aggregating gateway.
		Timeout: 2 * time.Second,
		// Opening a secure channel with RSA, a session and reading the
		// namespace table is four round trips and two key operations.
		ConnectTimeout: 5 * time.Second,
		// A restarting server refuses connections for seconds; one
		// attempt a second is enough to notice it is back.
		Reconnect: time.Second,
		// One small message a second per subscription costs a PLC
		// nothing, and bounds how long a dead server's last values can
		// pass for current: keepalive_ms + a publishing interval +
		// timeout_ms, 4 s at most.
		KeepAlive: time.Second,
	}
}

// busSpec is a validated bus entry.
type busSpec struct {
	name  string
	field string
	Config
}

// parseBus decodes and validates an opcua bus entry strictly. Files
// (certificates, key) are read here, so a missing file is a positioned
// configuration error at validate time.
func parseBus(b *manifest.Bus) (*busSpec, error) { return parseBusEntry(b, false) }

// parseBusEntry is parseBus; with pinLater a secured bus may name neither
// server_certificate nor server_trust: a scan shows the server's
// certificate and pins it once the person scanning has compared it.
func parseBusEntry(b *manifest.Bus, pinLater bool) (*busSpec, error) {
	root := b.FieldPath()
	cfg := strictyaml.WithoutKey(b.Config, "type")
	p := &strictyaml.Problems{File: b.Pos.File, Root: root, Top: cfg, At: b.Pos}
	var k busKeys
	if errs := strictyaml.Decode(b.Pos.File, cfg, root, &k); len(errs) > 0 {
		return nil, errs
	}
	s := &busSpec{name: b.Name, field: root, Config: DefaultConfig()}
	dir := filepath.Dir(b.Pos.File)

	if k.Endpoint == nil || strings.TrimSpace(*k.Endpoint) == "" {
		p.Add("required: the server's endpoint URL", "add endpoint: opc.tcp://plc.local:4840", "endpoint")
	} else if u, err := url.Parse(*k.Endpoint); err != nil || u.Scheme != "opc.tcp" || u.Host == "" {
		p.Add(fmt.Sprintf("endpoint %q is not an opc.tcp:// URL", *k.Endpoint), "write it as opc.tcp://host:port[/path], e.g. opc.tcp://127.0.0.1:4840", "endpoint")
	} else {
		s.Endpoint = *k.Endpoint
	}
	if k.SecurityPolicy != nil {
		if !oneOf(*k.SecurityPolicy, policies) {
			p.Add(fmt.Sprintf("security_policy %q is not supported", *k.SecurityPolicy), "use "+strings.Join(policies, " or "), "security_policy")
		} else {
			s.Policy = *k.SecurityPolicy
		}
	}
	if s.Policy != PolicyNone {
		s.Mode = ModeSignAndEncrypt
	}
	if k.SecurityMode != nil {
		switch {
		case !oneOf(*k.SecurityMode, modes):
			p.Add(fmt.Sprintf("security_mode %q is not supported", *k.SecurityMode), "use "+strings.Join(modes, ", "), "security_mode")
		case s.Policy == PolicyNone && *k.SecurityMode != ModeNone:
			p.Add(fmt.Sprintf("security_mode %s needs a security policy", *k.SecurityMode), "add security_policy: Basic256Sha256, or use security_mode: None", "security_mode")
		case s.Policy != PolicyNone && *k.SecurityMode == ModeNone:
			p.Add("security_mode None with security_policy "+s.Policy, "use security_mode: Sign or SignAndEncrypt, or security_policy: None", "security_mode")
		default:
			s.Mode = *k.SecurityMode
		}
	}

	ms := func(v *int, into *time.Duration, lo, hi int, key, fix string) {
		if v == nil {
			return
		}
		if *v < lo || *v > hi {
			p.Add(fmt.Sprintf("%s must be between %d and %d, got %d", key, lo, hi, *v), fix, key)
			return
		}
		*into = time.Duration(*v) * time.Millisecond
	}
	ms(k.TimeoutMS, &s.Timeout, 10, 60_000, "timeout_ms", "use the server's reply time with a margin, e.g. 2000")
	ms(k.ConnectTimeoutMS, &s.ConnectTimeout, 100, 120_000, "connect_timeout_ms", "e.g. 5000")
	ms(k.ReconnectMS, &s.Reconnect, 0, 600_000, "reconnect_backoff_ms", "e.g. 1000")
	ms(k.KeepAliveMS, &s.KeepAlive, 100, 60_000, "keepalive_ms", "e.g. 1000: a lost subscription is noticed within 2 × keepalive_ms + timeout_ms at most")

	if k.ApplicationURI != nil {
		s.ApplicationURI = *k.ApplicationURI
	}
	parseCerts(p, &k, s, dir, pinLater)
	parseIdentity(p, &k, s, dir)
	if err := p.Err(); err != nil {
		return nil, err
	}
	return s, nil
}

func parseCerts(p *strictyaml.Problems, k *busKeys, s *busSpec, dir string, pinLater bool) {
	abs := func(f string) string {
		if filepath.IsAbs(f) {
			return f
		}
		return filepath.Join(dir, f)
	}
	if s.Policy == PolicyNone {
		for key, given := range map[string]bool{"certificate": k.Certificate != nil, "private_key": k.PrivateKey != nil,
			"server_certificate": k.ServerCertificate != nil, "server_trust": k.ServerTrust != nil} {
			if given {
				p.Add(key+" applies to a secured bus; security_policy is None", "remove "+key+", or set security_policy: Basic256Sha256", key)
			}
		}
		return
	}
	if (k.Certificate == nil) != (k.PrivateKey == nil) {
		p.Add("certificate and private_key go together", "give both (PEM or DER files), or neither and physd generates a certificate at each start", "certificate")
	} else if k.Certificate != nil {
		s.CertFile, s.KeyFile = abs(*k.Certificate), abs(*k.PrivateKey)
		cert, err := readCert(s.CertFile)
		if err != nil {
			p.Add(err.Error(), "give the application instance certificate (PEM or DER)", "certificate")
		}
		key, err := readKey(s.KeyFile)
		if err != nil {
			p.Add(err.Error(), "give the certificate's RSA private key (PEM: PKCS#1 or PKCS#8)", "private_key")
		}
		if cert != nil && key != nil {
			c, _ := x509.ParseCertificate(cert)
			if pub, ok := c.PublicKey.(*rsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
				p.Add("private_key does not belong to certificate", "give the key the certificate was issued for", "private_key")
			}
			if s.ApplicationURI == "" && len(c.URIs) > 0 {
				s.ApplicationURI = c.URIs[0].String()
			}
		}
		s.cert, s.key = cert, key
	}
	if k.ServerCertificate != nil && k.ServerTrust != nil {
		p.Add("server_certificate and server_trust both given", "pin one certificate (server_certificate) or trust a list (server_trust), not both", "server_trust")
		return
	}
	if k.ServerTrust != nil {
		if len(k.ServerTrust) == 0 {
			p.Add("server_trust is empty", "list the CA certificates (or the servers' own certificates) to trust", "server_trust")
			return
		}
		s.trust = x509.NewCertPool()
		for _, f := range k.ServerTrust {
			f = abs(f)
			der, err := readCert(f)
			if err != nil {
				p.Add(err.Error(), "list certificate files (PEM or DER)", "server_trust")
				continue
			}
			c, _ := x509.ParseCertificate(der)
			s.trust.AddCert(c)
			s.ServerTrust = append(s.ServerTrust, f)
		}
		return
	}
	if k.ServerCertificate == nil && pinLater {
		return
	}
	if k.ServerCertificate == nil {
		p.Add("a secured bus needs the server certificate to pin, or a trust list", "add server_certificate: the server's certificate file (PEM or DER), copied from the server's PKI (own/certs), or server_trust: [the CA that issued it]", "security_policy")
		return
	}
	s.ServerCertFile = abs(*k.ServerCertificate)
	cert, err := readCert(s.ServerCertFile)
	if err != nil {
		p.Add(err.Error(), "give the server's certificate (PEM or DER), copied from the server's PKI", "server_certificate")
	}
	s.serverCert = cert
}

func parseIdentity(p *strictyaml.Problems, k *busKeys, s *busSpec, dir string) {
	if k.UserCertificate != nil || k.UserPrivateKey != nil {
		switch {
		case k.UserCertificate == nil || k.UserPrivateKey == nil:
			p.Add("user_certificate and user_private_key go together", "give both: the user's X.509 certificate and its RSA key", "user_certificate")
		case k.Username != nil:
			p.Add("username and user_certificate both given", "use one identity: a user name with password_env, or a user certificate", "user_certificate")
		case s.Policy == PolicyNone:
			p.Add("a user certificate needs a secured channel (its token is signed with the channel's policy)", "set security_policy: Basic256Sha256", "user_certificate")
		default:
			abs := func(f string) string {
				if filepath.IsAbs(f) {
					return f
				}
				return filepath.Join(dir, f)
			}
			s.UserCertFile, s.UserKeyFile = abs(*k.UserCertificate), abs(*k.UserPrivateKey)
			cert, err := readCert(s.UserCertFile)
			if err != nil {
				p.Add(err.Error(), "give the user's X.509 certificate (PEM or DER)", "user_certificate")
			}
			key, err := readKey(s.UserKeyFile)
			if err != nil {
				p.Add(err.Error(), "give the user certificate's RSA private key", "user_private_key")
			}
			if cert != nil && key != nil {
				c, _ := x509.ParseCertificate(cert)
				if pub, ok := c.PublicKey.(*rsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
					p.Add("user_private_key does not belong to user_certificate", "give the key the user certificate was issued for", "user_private_key")
				}
			}
			s.userCert, s.userKey = cert, key
		}
	}
	if k.PasswordEnv != nil && k.Username == nil {
		p.Add("password_env without username", "add username:, or remove password_env", "password_env")
	}
	if k.Username == nil {
		return
	}
	s.Username = *k.Username
	if k.PasswordEnv == nil || *k.PasswordEnv == "" {
		p.Add("username needs password_env: the environment variable that holds the password (never the password in the manifest)", "add password_env: OPCUA_PASSWORD", "username")
		return
	}
	s.PasswordEnv = *k.PasswordEnv
}

// password is the user's password, read from the environment at connect
// time (so a rotated password needs no manifest change).
func (c *Config) password() (string, error) {
	v, ok := os.LookupEnv(c.PasswordEnv)
	if !ok {
		return "", fmt.Errorf("password_env %s is not set in physd's environment", c.PasswordEnv)
	}
	return v, nil
}

// readCert reads a certificate file, PEM or DER, and returns its DER.
func readCert(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("certificate: %v", err)
	}
	if blk, _ := pem.Decode(b); blk != nil {
		b = blk.Bytes
	}
	if _, err := x509.ParseCertificate(b); err != nil {
		return nil, fmt.Errorf("%s is not an X.509 certificate: %v", file, err)
	}
	return b, nil
}

// readKey reads an RSA private key file, PEM (PKCS#1 or PKCS#8) or DER.
func readKey(file string) (*rsa.PrivateKey, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("private_key: %v", err)
	}
	if blk, _ := pem.Decode(b); blk != nil {
		b = blk.Bytes
	}
	if k, err := x509.ParsePKCS1PrivateKey(b); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s is not an RSA private key: %v", file, err)
	}
	rk, ok := k.(*rsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s is not an RSA key (OPC UA's security policies need RSA)", file)
	}
	return rk, nil
}

// fingerprint is a certificate's SHA-256, hex, as operators compare them.
func fingerprint(der []byte) string {
	h := sha256.Sum256(der)
	return hex.EncodeToString(h[:])
}

func oneOf(v string, options []string) bool {
	for _, o := range options {
		if v == o {
			return true
		}
	}
	return false
}
