package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"github.com/physd/physd/mqtt"
)

// MQTTSettings are physd run's --mqtt-* flags (the publisher is off
// without a URL); Config turns them into the publisher's configuration.
type MQTTSettings struct {
	URL, Prefix, Discovery, Username, PasswordFile, CA, Cert, Key string
	Queue                                                         int
}

// Config checks the settings (before anything is opened) and builds the
// publisher's configuration; nil without --mqtt-url.
func (q MQTTSettings) Config() (*mqtt.Config, error) {
	if q.URL == "" {
		for _, f := range [][2]string{{"--mqtt-username", q.Username}, {"--mqtt-password-file", q.PasswordFile}, {"--mqtt-ca", q.CA}, {"--mqtt-client-cert", q.Cert}} {
			if f[1] != "" {
				return nil, fmt.Errorf("%s without --mqtt-url; fix: give the broker with --mqtt-url, or drop %s", f[0], f[0])
			}
		}
		return nil, nil
	}
	if err := mqtt.ValidateURL(q.URL); err != nil {
		return nil, fmt.Errorf("--mqtt-url %s: %w", q.URL, err)
	}
	if err := mqtt.ValidateTopicPart(q.Prefix); err != nil {
		return nil, fmt.Errorf("--mqtt-prefix: %w", err)
	}
	if q.Discovery != "-" {
		if err := mqtt.ValidateTopicPart(q.Discovery); err != nil {
			return nil, fmt.Errorf("--mqtt-discovery-prefix: %w", err)
		}
	}
	if q.Queue < 0 {
		return nil, fmt.Errorf("--mqtt-queue %d; fix: give a positive number of messages, or 0 for 1024 plus one per capability", q.Queue)
	}
	c := &mqtt.Config{URL: q.URL, Prefix: q.Prefix, DiscoveryPrefix: q.Discovery, Username: q.Username, Queue: q.Queue}
	c.Password = os.Getenv("PHYSD_MQTT_PASSWORD")
	if q.PasswordFile != "" {
		b, err := os.ReadFile(q.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("--mqtt-password-file: %w", err)
		}
		c.Password = strings.TrimRight(string(b), "\r\n")
	}
	if c.Password != "" && q.Username == "" {
		return nil, fmt.Errorf("an MQTT password without --mqtt-username; fix: give the user name with --mqtt-username")
	}
	tlsURL := strings.HasPrefix(q.URL, "ssl://") || strings.HasPrefix(q.URL, "tls://") || strings.HasPrefix(q.URL, "mqtts://") || strings.HasPrefix(q.URL, "wss://")
	if (q.CA != "" || q.Cert != "") && !tlsURL {
		return nil, fmt.Errorf("--mqtt-ca/--mqtt-client-cert with the plain URL %s; fix: use mqtts://, ssl://, tls:// or wss://", q.URL)
	}
	if (q.Cert == "") != (q.Key == "") {
		return nil, fmt.Errorf("--mqtt-client-cert and --mqtt-client-key go together; fix: give both or neither")
	}
	if tlsURL {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if q.CA != "" {
			b, err := os.ReadFile(q.CA)
			if err != nil {
				return nil, fmt.Errorf("--mqtt-ca: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(b) {
				return nil, fmt.Errorf("--mqtt-ca %s holds no PEM certificate; fix: the CA certificate that issued the broker's, PEM-encoded", q.CA)
			}
		}
		if q.Cert != "" {
			cert, err := tls.LoadX509KeyPair(q.Cert, q.Key)
			if err != nil {
				return nil, fmt.Errorf("--mqtt-client-cert/--mqtt-client-key: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		c.TLS = tc
	}
	return c, nil
}
