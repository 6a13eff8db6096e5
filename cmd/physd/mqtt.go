package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/physd/physd/mqtt"
)

// mqttFlags configure the MQTT northbound publisher (off without --mqtt-url).
type mqttFlags struct {
	url, prefix, discovery, username, passwordFile, ca, cert, key string
	queue                                                         int
}

func (q *mqttFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&q.url, "mqtt-url", "", "publish observations and alarms to this MQTT broker (tcp://host:1883, mqtts://host:8883, ws://, wss://); publish only, no command enters through MQTT")
	fs.StringVar(&q.prefix, "mqtt-prefix", "physd", "MQTT topic prefix: topics are <prefix>/<device_id>/...")
	fs.StringVar(&q.discovery, "mqtt-discovery-prefix", "homeassistant", "Home Assistant MQTT discovery prefix; - turns discovery off")
	fs.StringVar(&q.username, "mqtt-username", "", "MQTT user name")
	fs.StringVar(&q.passwordFile, "mqtt-password-file", "", "file holding the MQTT password (or set PHYSD_MQTT_PASSWORD)")
	fs.StringVar(&q.ca, "mqtt-ca", "", "PEM CA certificate(s) that verify the broker (TLS URLs; default the system roots)")
	fs.StringVar(&q.cert, "mqtt-client-cert", "", "PEM client certificate for the broker (mutual TLS)")
	fs.StringVar(&q.key, "mqtt-client-key", "", "the private key of --mqtt-client-cert (PEM)")
	fs.IntVar(&q.queue, "mqtt-queue", 1024, "messages that may wait for the broker; beyond it they are dropped and counted")
}

// config checks the flags (before anything is opened) and builds the
// publisher's configuration; nil without --mqtt-url.
func (q *mqttFlags) config() (*mqtt.Config, error) {
	if q.url == "" {
		for _, f := range [][2]string{{"--mqtt-username", q.username}, {"--mqtt-password-file", q.passwordFile}, {"--mqtt-ca", q.ca}, {"--mqtt-client-cert", q.cert}} {
			if f[1] != "" {
				return nil, fmt.Errorf("%s without --mqtt-url; fix: give the broker with --mqtt-url, or drop %s", f[0], f[0])
			}
		}
		return nil, nil
	}
	if err := mqtt.ValidateURL(q.url); err != nil {
		return nil, fmt.Errorf("--mqtt-url %s: %w", q.url, err)
	}
	if err := mqtt.ValidateTopicPart(q.prefix); err != nil {
		return nil, fmt.Errorf("--mqtt-prefix: %w", err)
	}
	if q.discovery != "-" {
		if err := mqtt.ValidateTopicPart(q.discovery); err != nil {
			return nil, fmt.Errorf("--mqtt-discovery-prefix: %w", err)
		}
	}
	if q.queue <= 0 {
		return nil, fmt.Errorf("--mqtt-queue %d; fix: give a positive number of messages", q.queue)
	}
	c := &mqtt.Config{URL: q.url, Prefix: q.prefix, DiscoveryPrefix: q.discovery, Username: q.username, Queue: q.queue}
	c.Password = os.Getenv("PHYSD_MQTT_PASSWORD")
	if q.passwordFile != "" {
		b, err := os.ReadFile(q.passwordFile)
		if err != nil {
			return nil, fmt.Errorf("--mqtt-password-file: %w", err)
		}
		c.Password = strings.TrimRight(string(b), "\r\n")
	}
	if c.Password != "" && q.username == "" {
		return nil, fmt.Errorf("an MQTT password without --mqtt-username; fix: give the user name with --mqtt-username")
	}
	tlsURL := strings.HasPrefix(q.url, "ssl://") || strings.HasPrefix(q.url, "tls://") || strings.HasPrefix(q.url, "mqtts://") || strings.HasPrefix(q.url, "wss://")
	if (q.ca != "" || q.cert != "") && !tlsURL {
		return nil, fmt.Errorf("--mqtt-ca/--mqtt-client-cert with the plain URL %s; fix: use mqtts://, ssl://, tls:// or wss://", q.url)
	}
	if (q.cert == "") != (q.key == "") {
		return nil, fmt.Errorf("--mqtt-client-cert and --mqtt-client-key go together; fix: give both or neither")
	}
	if tlsURL {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if q.ca != "" {
			b, err := os.ReadFile(q.ca)
			if err != nil {
				return nil, fmt.Errorf("--mqtt-ca: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(b) {
				return nil, fmt.Errorf("--mqtt-ca %s holds no PEM certificate; fix: the CA certificate that issued the broker's, PEM-encoded", q.ca)
			}
		}
		if q.cert != "" {
			cert, err := tls.LoadX509KeyPair(q.cert, q.key)
			if err != nil {
				return nil, fmt.Errorf("--mqtt-client-cert/--mqtt-client-key: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		c.TLS = tc
	}
	return c, nil
}
