package main

import (
	"flag"
	"strings"

	"github.com/physd/physd/daemon"
)

// The run flags of the HTTP listener's exposure, mDNS and MQTT.

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

// mdnsFlags are physd run's mDNS flags.
type mdnsFlags struct{ iface string }

func (f *mdnsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.iface, "mdns-interface", "", "mDNS: advertise this gateway (_physmcp._tcp) and, without seed_peers, find and join the site's gateways on this one interface (e.g. eth0; lo keeps it on this host); turns mDNS on and overrides network.mesh.mdns.interface")
}

// registerMQTT registers the --mqtt-* flags (daemon.MQTTSettings.Config checks them).
func registerMQTT(fs *flag.FlagSet, q *daemon.MQTTSettings) {
	fs.StringVar(&q.URL, "mqtt-url", "", "publish observations and alarms to this MQTT broker (tcp://host:1883, mqtts://host:8883, ws://, wss://); publish only, no command enters through MQTT")
	fs.StringVar(&q.Prefix, "mqtt-prefix", "physd", "MQTT topic prefix: topics are <prefix>/<device_id>/...")
	fs.StringVar(&q.Discovery, "mqtt-discovery-prefix", "homeassistant", "Home Assistant MQTT discovery prefix; - turns discovery off")
	fs.StringVar(&q.Username, "mqtt-username", "", "MQTT user name")
	fs.StringVar(&q.PasswordFile, "mqtt-password-file", "", "file holding the MQTT password (or set PHYSD_MQTT_PASSWORD)")
	fs.StringVar(&q.CA, "mqtt-ca", "", "PEM CA certificate(s) that verify the broker (TLS URLs; default the system roots)")
	fs.StringVar(&q.Cert, "mqtt-client-cert", "", "PEM client certificate for the broker (mutual TLS)")
	fs.StringVar(&q.Key, "mqtt-client-key", "", "the private key of --mqtt-client-cert (PEM)")
	fs.IntVar(&q.Queue, "mqtt-queue", 0, "messages that may wait for the broker (0: 1024 plus one per capability); beyond it they are dropped and counted")
}
