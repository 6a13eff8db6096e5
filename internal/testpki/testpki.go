// Package testpki makes throw-away certificate authorities and leaf
// certificates for tests of physd's TLS and mTLS (crypto/x509 only, no
// openssl). Keys are ECDSA P-256; nothing here is meant for production.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a self-signed certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is the CA certificate, PEM-encoded.
	PEM []byte
}

// Leaf is a certificate issued by a CA, with its key.
type Leaf struct {
	Cert    *x509.Certificate
	CertPEM []byte // the leaf certificate, PEM
	KeyPEM  []byte // its PKCS#8 private key, PEM
}

// Spec says what a leaf certificate names and may be used for.
type Spec struct {
	CN       string
	DNS      []string
	IPs      []net.IP
	URIs     []string
	Emails   []string
	Server   bool // ExtKeyUsageServerAuth
	Client   bool // ExtKeyUsageClientAuth
	NotAfter time.Time
}

// NewCA makes a self-signed CA valid for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"physd test"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pemBlock("CERTIFICATE", der)}, nil
}

// Issue signs a leaf certificate.
func (ca *CA) Issue(s Spec) (*Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	notAfter := s.NotAfter
	if notAfter.IsZero() {
		notAfter = time.Now().Add(24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber:   serial(),
		Subject:        pkix.Name{CommonName: s.CN},
		NotBefore:      time.Now().Add(-time.Hour),
		NotAfter:       notAfter,
		KeyUsage:       x509.KeyUsageDigitalSignature,
		DNSNames:       s.DNS,
		IPAddresses:    s.IPs,
		EmailAddresses: s.Emails,
	}
	for _, u := range s.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			return nil, err
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	if s.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if s.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Leaf{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", pk)}, nil
}

// Server issues a server certificate for localhost, 127.0.0.1 and ::1.
func (ca *CA) Server() (*Leaf, error) {
	return ca.Issue(Spec{CN: "localhost", DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, Server: true})
}

// Client issues a client certificate with the given subject CN.
func (ca *CA) Client(cn string) (*Leaf, error) {
	return ca.Issue(Spec{CN: cn, Client: true})
}

// Pool is a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// TLS is the leaf as a tls.Certificate (for a client or server config).
func (l *Leaf) TLS() (tls.Certificate, error) {
	return tls.X509KeyPair(l.CertPEM, l.KeyPEM)
}

// WriteFiles writes the leaf to dir/name.pem and dir/name-key.pem (mode
// 0600) and returns both paths.
func (l *Leaf) WriteFiles(dir, name string) (certPath, keyPath string, err error) {
	certPath, keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err = os.WriteFile(certPath, l.CertPEM, 0o600); err != nil {
		return "", "", err
	}
	return certPath, keyPath, os.WriteFile(keyPath, l.KeyPEM, 0o600)
}

// WriteFile writes the CA certificate to path.
func (ca *CA) WriteFile(path string) error { return os.WriteFile(path, ca.PEM, 0o600) }

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return n
}
