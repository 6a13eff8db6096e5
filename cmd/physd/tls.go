package main

import (
	"flag"
	"strings"
)

// tlsFlags are the run flags that decide how the HTTP listener is exposed:
// TLS, client certificates, plain HTTP off loopback, extra Host names.
type tlsFlags struct {
	cert, key, clientCA string
	insecurePlainHTTP   bool
	allowedHosts        listFlag
}

func (t *tlsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.cert, "tls-cert", "", "serve HTTPS with this PEM certificate (chain); reloaded on SIGHUP")
	fs.StringVar(&t.key, "tls-key", "", "the private key of --tls-cert (PEM)")
	fs.StringVar(&t.clientCA, "tls-client-ca", "", "PEM CA certificate(s) whose client certificates are accepted (mTLS); the policy's mtls provider maps them to roles")
	fs.BoolVar(&t.insecurePlainHTTP, "insecure-plain-http", false, "allow plain HTTP on a non-loopback --http (bearer tokens cross the network in the clear)")
	fs.Var(&t.allowedHosts, "allowed-host", "a Host name physd answers to besides localhost and its IPs (repeatable or comma-separated), e.g. gw1.plant.example")
}

// listFlag is a repeatable, comma-separated string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}
