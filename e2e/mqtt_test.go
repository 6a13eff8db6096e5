package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// broker is a mosquitto process on a fixed local port (so a restart keeps it).
type broker struct {
	bin, conf string
	port      int
	cmd       *exec.Cmd
	done      chan struct{}
	log       *syncBuffer
}

func mosquittoBin(t testing.TB) string {
	if p, err := exec.LookPath("mosquitto"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("mosquitto is not installed; .ci/run must install Debian's mosquitto package")
	}
	t.Skip("mosquitto is not installed (Debian: apt-get install mosquitto; .ci/run installs it): the MQTT tests need a real broker")
	return ""
}

func startBroker(t testing.TB) *broker { return startBrokerConf(t, "allow_anonymous true\n") }

// startBrokerConf starts mosquitto with these lines under its listener.
func startBrokerConf(t testing.TB, extra string) *broker {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	b := &broker{bin: mosquittoBin(t), conf: filepath.Join(t.TempDir(), "mosquitto.conf"), port: port, log: &syncBuffer{}}
	conf := fmt.Sprintf("listener %d 127.0.0.1\n%spersistence false\nlog_dest stderr\n", port, extra)
	if os.Geteuid() == 0 {
		conf += "user root\n"
	}
	if err := os.WriteFile(b.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	b.start(t)
	t.Cleanup(b.stop)
	return b
}

func (b *broker) url() string { return fmt.Sprintf("tcp://127.0.0.1:%d", b.port) }

func (b *broker) start(t testing.TB) {
	t.Helper()
	b.cmd = exec.Command(b.bin, "-c", b.conf)
	b.cmd.Stderr, b.cmd.Stdout = b.log, b.log
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b.done = make(chan struct{})
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", b.port))
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("mosquitto not listening on %d within 15 s:\n%s", b.port, b.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *broker) stop() {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	select {
	case <-b.done:
		return
	default:
	}
	_ = b.cmd.Process.Kill()
	<-b.done
}

// mqttWatcher is a paho subscriber to every topic; it keeps each topic's
// payloads and subscribes again after a reconnect.
type mqttWatcher struct {
	mu   sync.Mutex
	msgs map[string][]string
	c    paho.Client
}

func watchMQTT(t *testing.T, url string, opts ...func(*paho.ClientOptions)) *mqttWatcher {
	t.Helper()
	w := &mqttWatcher{msgs: map[string][]string{}}
	o := paho.NewClientOptions().AddBroker(url).SetClientID("e2e-watcher").SetAutoReconnect(true).
		SetMaxReconnectInterval(500 * time.Millisecond).SetConnectRetry(true).SetConnectRetryInterval(200 * time.Millisecond)
	o.SetOnConnectHandler(func(c paho.Client) {
		c.Subscribe("#", 1, func(_ paho.Client, m paho.Message) {
			w.mu.Lock()
			w.msgs[m.Topic()] = append(w.msgs[m.Topic()], string(m.Payload()))
			w.mu.Unlock()
		})
	})
	for _, f := range opts {
		f(o)
	}
	w.c = paho.NewClient(o)
	if tok := w.c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("watcher connect: %v", tok.Error())
	}
	t.Cleanup(func() { w.c.Disconnect(100) })
	return w
}

// last is the last payload seen on topic ("" if none).
func (w *mqttWatcher) last(topic string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m := w.msgs[topic]; len(m) > 0 {
		return m[len(m)-1]
	}
	return ""
}

func (w *mqttWatcher) reset() {
	w.mu.Lock()
	w.msgs = map[string][]string{}
	w.mu.Unlock()
}

func (w *mqttWatcher) dump() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	for t, m := range w.msgs {
		fmt.Fprintf(&b, "%s: %d messages, last %s\n", t, len(m), m[len(m)-1])
	}
	return b.String()
}

// stateValue is the value field of an observation payload.
func stateValue(payload string) (float64, bool) {
	var o struct {
		Value   *float64 `json:"value"`
		Quality string   `json:"quality"`
	}
	if json.Unmarshal([]byte(payload), &o) != nil || o.Value == nil || o.Quality != "good" {
		return 0, false
	}
	return *o.Value, true
}

// TestMQTTNorthbound runs the binary against a real mosquitto: Home
// Assistant discovery and state payloads, alarms, do_ latency with the
// broker up and down (logged, same run), publishing resumed after a broker
// restart, and the last will on SIGKILL.
func TestMQTTNorthbound(t *testing.T) {
	b := startBroker(t)
	w := watchMQTT(t, b.url())
	dir := t.TempDir()
	man := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(man, []byte(observedManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--mqtt-url", b.url(), "--mqtt-prefix", "site1/physd", "--mqtt-queue", "8"}})
	cs := connectHTTP(t, d, "2025-06-18")

	const (
		avail  = "site1/physd/obs_gw/availability"
		state  = "site1/physd/obs_gw/obs/read_heater_power_zone_a"
		config = "homeassistant/sensor/obs_gw/read_heater_power_zone_a/config"
		alarm  = "site1/physd/obs_gw/alarm/read_heater_power_zone_a/high"
	)
	waitFor(t, "availability online, discovery config and a first state", func() bool {
		return w.last(avail) == "online" && w.last(config) != "" && w.last(state) != ""
	})
	var cfg map[string]any
	if err := json.Unmarshal([]byte(w.last(config)), &cfg); err != nil {
		t.Fatalf("discovery config: %v: %s", err, w.last(config))
	}
	for k, want := range map[string]any{"state_topic": state, "availability_topic": avail, "unit_of_measurement": "%",
		"state_class": "measurement", "value_template": "{{ value_json.value }}", "unique_id": "physd_obs_gw_read_heater_power_zone_a",
		"payload_available": "online", "payload_not_available": "offline"} {
		if cfg[k] != want {
			t.Errorf("discovery config %s = %v, want %v", k, cfg[k], want)
		}
	}
	dev, _ := cfg["device"].(map[string]any)
	if ids, _ := dev["identifiers"].([]any); len(ids) != 1 || ids[0] != "physd_obs_gw" || dev["name"] != "obs_gw" {
		t.Errorf("discovery device = %v, want identifiers [physd_obs_gw], name obs_gw", dev)
	}
	if w.last("homeassistant/sensor/obs_gw/do_heater_zone_a/config") != "" {
		t.Error("a do_ capability was announced as a sensor")
	}

	// A do_ beyond the deadband shows on the state topic; the alarm it
	// raises shows on the alarm topic.
	if res := call(t, cs, "do_heater_zone_a", map[string]any{"value": 70, "idempotency_key": "mqtt-hot"}); res.IsError {
		t.Fatalf("do: %s", text(res))
	}
	waitFor(t, "state 70 on "+state, func() bool { v, ok := stateValue(w.last(state)); return ok && v == 70 })
	var obs map[string]any
	_ = json.Unmarshal([]byte(w.last(state)), &obs)
	if obs["unit"] != "percent" || obs["capability"] != "read_heater_power_zone_a" || obs["source"] != "obs_gw" {
		t.Errorf("state payload %v: want unit percent, capability read_heater_power_zone_a, source obs_gw", obs)
	}
	waitFor(t, "the do_'s read-back on obs/do_heater_zone_a", func() bool {
		v, ok := stateValue(w.last("site1/physd/obs_gw/obs/do_heater_zone_a"))
		return ok && v == 70
	})
	waitFor(t, "the do_ result on do/do_heater_zone_a", func() bool {
		var r map[string]any
		return json.Unmarshal([]byte(w.last("site1/physd/obs_gw/do/do_heater_zone_a")), &r) == nil &&
			r["status"] == "success" && r["verified"] == true && r["applied_value"] == 70.0 && r["idempotency_key"] == "mqtt-hot"
	})
	if r := w.last("site1/physd/obs_gw/do/do_heater_zone_a"); strings.Contains(r, "caller") || strings.Contains(r, "policy") {
		t.Errorf("the do_ result carries the caller or the policy note: %s", r)
	}
	waitFor(t, "alarm raised on "+alarm, func() bool { return strings.Contains(w.last(alarm), `"state":"raised"`) })

	// do_ latency with the broker up, then down: the same run, logged.
	doLatency := func(tag string, n int) []time.Duration {
		var ds []time.Duration
		for i := range n {
			start := time.Now()
			res := call(t, cs, "do_heater_zone_a", map[string]any{"value": 10 + i%2*20, "idempotency_key": fmt.Sprintf("mqtt-%s-%d", tag, i)})
			ds = append(ds, time.Since(start))
			if res.IsError || structured(t, res)["status"] != "success" {
				t.Fatalf("do_ with the broker %s: %s", tag, text(res))
			}
		}
		slices.Sort(ds)
		return ds
	}
	doLatency("warmup", 5)
	up := doLatency("up", 40)

	// A hung broker (SIGSTOP: the connection stays open, nothing is
	// acknowledged): the publisher waits, its small queue fills and drops
	// are counted; the do_ calls do not wait.
	dropped := func() float64 {
		_, m := d.request(t, "GET", "/metrics", "")
		var v float64
		for _, l := range strings.Split(string(m), "\n") {
			if strings.HasPrefix(l, "physd_mqtt_dropped ") {
				fmt.Sscan(strings.TrimPrefix(l, "physd_mqtt_dropped "), &v)
			}
		}
		return v
	}
	before := dropped()
	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	hung := doLatency("hung", 40)
	if after := dropped(); after <= before {
		t.Errorf("physd_mqtt_dropped %v -> %v with a hung broker and a queue of 8: the overflow is not counted", before, after)
	}
	if err := b.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	b.stop()
	waitFor(t, "physd_mqtt_connected 0", func() bool {
		_, m := d.request(t, "GET", "/metrics", "")
		return strings.Contains(string(m), "physd_mqtt_connected 0")
	})
	down := doLatency("down", 40)
	_, m := d.request(t, "GET", "/metrics", "")
	if !strings.Contains(string(m), "physd_mqtt_dropped") || strings.Contains(string(m), "physd_mqtt_dropped 0\n") {
		t.Errorf("/metrics does not count the messages dropped while the broker was down:\n%s", grepLines(string(m), "physd_mqtt"))
	}

	// The broker restarts (no persistence: retained messages are gone):
	// physd reconnects and publishes availability, discovery and the
	// current value again, and later changes.
	w.reset()
	b.start(t)
	waitFor(t, "availability, discovery and state again after the broker restarted", func() bool {
		return w.last(avail) == "online" && w.last(config) != "" && w.last(state) != ""
	})
	if res := call(t, cs, "do_heater_zone_a", map[string]any{"value": 90, "idempotency_key": "mqtt-after-restart"}); res.IsError {
		t.Fatalf("do: %s", text(res))
	}
	waitFor(t, "state 90 after the restart", func() bool { v, ok := stateValue(w.last(state)); return ok && v == 90 })
	upAgain := doLatency("up-again", 40)
	t.Logf("do_ latency over HTTP, 40 calls each, same daemon (race build unless PHYSD_E2E_NORACE): broker up p50 %v p90 %v max %v; broker hung (SIGSTOP) p50 %v p90 %v max %v; broker down p50 %v p90 %v max %v; broker up again p50 %v p90 %v max %v",
		up[20], up[36], up[39], hung[20], hung[36], hung[39], down[20], down[36], down[39], upAgain[20], upAgain[36], upAgain[39])

	// SIGKILL: the broker publishes the last will.
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	waitFor(t, "last will offline on "+avail, func() bool { return w.last(avail) == "offline" })
	if t.Failed() {
		t.Logf("topics seen:\n%s", w.dump())
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestMQTTTLSAndCredentials: a broker that wants TLS and a password (no
// anonymous clients) gets physd's observations with --mqtt-ca,
// --mqtt-username and --mqtt-password-file; a wrong password never
// connects and costs the do_ nothing.
func TestMQTTTLSAndCredentials(t *testing.T) {
	t.Parallel()
	mosquittoBin(t)
	dir := t.TempDir()
	caPEM := writeTestPKI(t, dir)
	passwd := filepath.Join(dir, "passwd")
	for i, user := range []string{"gw", "watcher"} {
		args := []string{"-b", passwd, user, "s3cret-" + user}
		if i == 0 {
			args = append([]string{"-c"}, args...)
		}
		if out, err := exec.Command("mosquitto_passwd", args...).CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_passwd: %v: %s", err, out)
		}
	}
	b := startBrokerConf(t, fmt.Sprintf("cafile %s\ncertfile %s\nkeyfile %s\nallow_anonymous false\npassword_file %s\n",
		filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key"), passwd))
	url := fmt.Sprintf("mqtts://127.0.0.1:%d", b.port)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	w := watchMQTT(t, fmt.Sprintf("ssl://127.0.0.1:%d", b.port), func(o *paho.ClientOptions) {
		o.SetTLSConfig(&tls.Config{RootCAs: pool}).SetUsername("watcher").SetPassword("s3cret-watcher")
	})
	man := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(man, []byte(observedManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(dir, "gw.pw")
	if err := os.WriteFile(pw, []byte("s3cret-gw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--mqtt-url", url, "--mqtt-ca", filepath.Join(dir, "ca.pem"),
		"--mqtt-username", "gw", "--mqtt-password-file", pw}})
	waitFor(t, "availability and a state over TLS with credentials", func() bool {
		return w.last("physd/obs_gw/availability") == "online" && w.last("physd/obs_gw/obs/read_heater_power_zone_a") != ""
	})
	d.stop(t)
	waitFor(t, "offline on a clean stop", func() bool { return w.last("physd/obs_gw/availability") == "offline" })

	// A wrong password: refused by the broker, never connected; do_ works.
	if err := os.WriteFile(pw, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d = startHTTP(t, daemonOpts{manifest: man, extra: []string{"--mqtt-url", url, "--mqtt-ca", filepath.Join(dir, "ca.pem"),
		"--mqtt-username", "gw", "--mqtt-password-file", pw}})
	cs := connectHTTP(t, d, "2025-06-18")
	if res := call(t, cs, "do_heater_zone_a", map[string]any{"value": 30, "idempotency_key": "mqtt-badpw"}); res.IsError || structured(t, res)["status"] != "success" {
		t.Fatalf("do_ with a refused MQTT login: %s", text(res))
	}
	_, m := d.request(t, "GET", "/metrics", "")
	if !strings.Contains(string(m), "physd_mqtt_connected 0") {
		t.Errorf("a wrong password connected:\n%s", grepLines(string(m), "physd_mqtt"))
	}
	waitFor(t, "the refused login in the log", func() bool {
		return strings.Contains(d.stderr.String(), "mqtt broker not connected") && strings.Contains(d.stderr.String(), "not Authorized")
	})
}

// writeTestPKI writes ca.pem, server.pem and server.key (127.0.0.1) to dir
// and returns the CA certificate.
func writeTestPKI(t *testing.T, dir string) []byte {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e mqtt CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	for name, b := range map[string][]byte{"ca.pem": caPEM,
		"server.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"server.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return caPEM
}
