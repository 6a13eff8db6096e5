package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// hookManifest is the manifest physd starts with; hookReloaded the one a
// SIGHUP puts in force: humidity_zone_a removed, an alarm that holds
// declared on temperature_zone_a, a bus plant2 with temperature_zone_b
// added.
const hookManifest = `physmcp_version: "0.1"
device: {id: gw_hooks, type: greenhouse_controller, location: {zone: zone_a}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  plant:
    type: sim
    zones:
      zone_a: {ambient_c: 12, initial_c: 18}
capabilities:
  - name: temperature_zone_a
    kind: read
    description: Air temperature in zone A.
    binding: {type: sim, bus: plant, point: zone_a.temperature}
    data_type: float
    unit: celsius
    semantic_tags: [temperature]
    poll_ms: 200
  - name: humidity_zone_a
    kind: read
    description: Relative humidity in zone A.
    binding: {type: sim, bus: plant, point: zone_a.humidity}
    data_type: float
    unit: percent
    semantic_tags: [humidity]
    poll_ms: 200
`

const hookReloaded = `physmcp_version: "0.1"
device: {id: gw_hooks, type: greenhouse_controller, location: {zone: zone_a}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  plant:
    type: sim
    zones:
      zone_a: {ambient_c: 12, initial_c: 18}
  plant2:
    type: sim
    zones:
      zone_b: {ambient_c: 10, initial_c: 15}
capabilities:
  - name: temperature_zone_a
    kind: read
    description: Air temperature in zone A.
    binding: {type: sim, bus: plant, point: zone_a.temperature}
    data_type: float
    unit: celsius
    semantic_tags: [temperature]
    poll_ms: 200
    alarms: {high: -50}
  - name: temperature_zone_b
    kind: read
    description: Air temperature in zone B.
    binding: {type: sim, bus: plant2, point: zone_b.temperature}
    data_type: float
    unit: celsius
    semantic_tags: [temperature]
    poll_ms: 200
`

// TestSIGHUPReloadFollowsComponents: physd started with no alarm, one bus
// and MQTT on; a SIGHUP puts hookReloaded in force. The alarm it declares
// is evaluated (raised, logged, physd_alarm_active 1); the added bus has
// physd_bus_up; the added capability has history (MCP resource); the
// broker holds the added capability's discovery config and no longer the
// removed one's.
func TestSIGHUPReloadFollowsComponents(t *testing.T) {
	broker := startMosquitto(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(path, []byte(hookManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a missing log line fails when physd is killed
	defer cancel()
	cmd := physdCommand(ctx, "run", "--manifest", path, "--http", "127.0.0.1:0", "--state", filepath.Join(dir, "state"), "--mqtt-url", broker)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	lines := make(chan map[string]any, 256)
	go logLines(stderr, lines)
	l, _ := waitFor(t, lines, "listening")
	addr, _ := l["addr"].(string)
	waitFor(t, lines, "ready")
	scrape := func() string {
		t.Helper()
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
		}
		return string(b)
	}
	const (
		alarmSeries = `physd_alarm_active{capability="read_temperature_zone_a",kind="high"}`
		humConfig   = "homeassistant/sensor/gw_hooks/read_humidity_zone_a/config"
		tempBConfig = "homeassistant/sensor/gw_hooks/read_temperature_zone_b/config"
		avail       = "physd/gw_hooks/availability"
	)
	if body := scrape(); strings.Contains(body, alarmSeries) || strings.Contains(body, `physd_bus_up{bus="plant2"}`) {
		t.Fatalf("before the reload, /metrics shows the alarm or bus to come:\n%s", body)
	}
	waitRetained(t, broker, avail, []string{humConfig, tempBConfig}, "before the reload", func(g map[string]string) bool {
		_, b := g[tempBConfig]
		return g[humConfig] != "" && !b
	})

	if err := os.WriteFile(path, []byte(hookReloaded), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, lines, "manifest reloaded")
	if l, _ := waitFor(t, lines, "alarm raised"); l["capability"] != "read_temperature_zone_a" || l["kind"] != "high" {
		t.Errorf("alarm raised: %v, want the high alarm of read_temperature_zone_a", l)
	}
	body := scrape()
	for _, want := range []string{alarmSeries + " 1", `physd_bus_up{bus="plant2"} 1`, `physd_bus_up{bus="plant"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("after the reload, /metrics lacks %s", want)
		}
	}
	waitRetained(t, broker, avail, []string{humConfig, tempBConfig}, "after the reload", func(g map[string]string) bool {
		_, h := g[humConfig]
		return !h && g[tempBConfig] != ""
	})

	c := mcp.NewClient(&mcp.Implementation{Name: "reload-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "physmcp://history/temperature_zone_b?since=10m"})
		if err == nil && strings.Contains(res.Contents[0].Text, `"count":`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("history of the added capability: %v %v", res, err)
		}
	}
}

// startMosquitto runs Debian's mosquitto on a free local port (skipped
// where it is not installed, a failure in CI: .ci/run installs it) and
// returns its URL.
func startMosquitto(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
			}
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("mosquitto is not installed; .ci/run must install Debian's mosquitto package")
		}
		t.Skip("mosquitto is not installed (Debian: apt-get install mosquitto): this test needs a real broker")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	conf := filepath.Join(t.TempDir(), "mosquitto.conf")
	text := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\n", port)
	if os.Geteuid() == 0 {
		text += "user root\n"
	}
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", conf)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mosquitto not listening on %d within 15 s", port)
		}
	}
	return fmt.Sprintf("tcp://127.0.0.1:%d", port)
}

// waitRetained polls what the broker holds retained on topics (each
// subscribed in turn, then sentinel, a retained topic whose message
// arrives after theirs) until ok holds.
func waitRetained(t *testing.T, url, sentinel string, topics []string, what string, ok func(map[string]string) bool) {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID("reload-probe"))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("probe connect: %v", tok.Error())
	}
	defer c.Disconnect(50)
	var got map[string]string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		msgs := make(chan [2]string, 64)
		h := func(_ paho.Client, m paho.Message) { msgs <- [2]string{m.Topic(), string(m.Payload())} }
		got = map[string]string{}
		for _, tp := range append(append([]string{}, topics...), sentinel) {
			if tok := c.Subscribe(tp, 1, h); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
				t.Fatalf("subscribe %s: %v", tp, tok.Error())
			}
		}
		done := false
		for timeout := time.After(2 * time.Second); !done; {
			select {
			case m := <-msgs:
				if m[0] == sentinel {
					done = true
				} else {
					got[m[0]] = m[1]
				}
			case <-timeout:
				done = true
			}
		}
		c.Unsubscribe(append(append([]string{}, topics...), sentinel)...).WaitTimeout(5 * time.Second)
		if ok(got) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the broker holds %v", what, got)
		}
	}
}
