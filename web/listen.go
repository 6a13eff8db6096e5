package web

import (
	"fmt"
	"net"
)

// IsLoopback reports whether a listen address binds only to loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Exposure is how an HTTP listener is protected; CheckListen judges it.
type Exposure struct {
	Addr        string
	AllowRemote bool   // --allow-remote
	Token       string // the transport token (--auth-token-file, PHYSD_AUTH_TOKEN)
	ClientCerts bool   // client certificates are verified (--tls-client-ca)
	TLS         bool   // --tls-cert and --tls-key
	PlainHTTP   bool   // --insecure-plain-http
}

// CheckListen refuses a non-loopback bind unless it is explicitly allowed,
// needs a credential, and either speaks TLS or was explicitly allowed to
// carry bearer tokens in plain HTTP.
func CheckListen(e Exposure) error {
	if IsLoopback(e.Addr) {
		return nil
	}
	if !e.AllowRemote {
		return fmt.Errorf("--http %s is not a loopback address: physd binds to 127.0.0.1 by default because tools here move real equipment; "+
			"to listen on a network, pass --allow-remote, an auth token (--auth-token-file or PHYSD_AUTH_TOKEN) and --tls-cert/--tls-key", e.Addr)
	}
	if len(e.Token) < 16 && !(e.Token == "" && e.ClientCerts) {
		return fmt.Errorf("--http %s with --allow-remote needs an auth token of at least 16 characters (--auth-token-file or PHYSD_AUTH_TOKEN), "+
			"or client certificates (--tls-client-ca with an mtls identity provider in the policy)", e.Addr)
	}
	if !e.TLS && !e.PlainHTTP {
		return fmt.Errorf("--http %s is not a loopback address and plain HTTP would carry bearer tokens in the clear: "+
			"serve TLS with --tls-cert FILE --tls-key FILE, or pass --insecure-plain-http if a TLS-terminating proxy or an isolated network protects the link", e.Addr)
	}
	return nil
}
