package mqtt

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

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

// retainedOn is what the broker holds retained on topics, as a new
// subscriber sees it: each topic is subscribed in turn, then the
// availability topic, whose retained payload arrives after theirs.
func retainedOn(t *testing.T, url, availability string, topics []string) map[string]string {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprint("probe-", time.Now().UnixNano())))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("probe connect: %v", tok.Error())
	}
	defer c.Disconnect(50)
	got := make(chan [2]string, 64)
	h := func(_ paho.Client, m paho.Message) { got <- [2]string{m.Topic(), string(m.Payload())} }
	for _, tp := range append(append([]string{}, topics...), availability) {
		if tok := c.Subscribe(tp, 1, h); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", tp, tok.Error())
		}
	}
	out := map[string]string{}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-got:
			if m[0] == availability {
				return out
			}
			out[m[0]] = m[1]
		case <-timeout:
			t.Fatalf("no retained availability on %s", availability)
		}
	}
}

// TestReloadFollowsCapabilities: after a reload, the broker holds the
// discovery configs of the new manifest (added, changed, an entity type
// changed) and no longer those of removed capabilities, nor their
// retained observations and alarms; a late observation of a removed
// capability is not published.
func TestReloadFollowsCapabilities(t *testing.T) {
	url := startMosquitto(t)
	m1 := testManifest()
	p, err := New(Config{URL: url, MaxReconnect: 200 * time.Millisecond}, m1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	temp, hum, door := m1.Capabilities[0], m1.Capabilities[1], m1.Capabilities[4]

	m2 := testManifest()
	m2.Capabilities = []*manifest.Capability{
		{Name: "temperature_zone_a", Kind: "read", DataType: "float", Unit: "fahrenheit"},
		{Name: "mode", Kind: "read", DataType: "enum", EnumValues: []string{"auto", "manual"}},
		{Name: "heater_zone_a", Kind: "do", DataType: "float", Unit: "percent"},
		{Name: "door_open", Kind: "read", DataType: "float", Unit: "percent"}, // a binary_sensor becomes a sensor
		{Name: "co2", Kind: "read", DataType: "float", Unit: "ppm", SemanticTags: []string{"co2"}},
	}
	co2, door2 := m2.Capabilities[4], m2.Capabilities[3]
	topics := map[string]string{
		"temp":       p.DiscoveryTopic(temp),
		"hum":        p.DiscoveryTopic(hum),
		"door":       p.DiscoveryTopic(door),
		"door2":      p.DiscoveryTopic(door2),
		"co2":        p.DiscoveryTopic(co2),
		"hum_obs":    p.StateTopic(hum.ToolName()),
		"hum_alarm":  p.AlarmTopic(hum.ToolName(), alarms.KindHigh),
		"temp_obs":   p.StateTopic(temp.ToolName()),
		"mode_disco": p.DiscoveryTopic(m1.Capabilities[2]),
	}
	var list []string
	for _, tp := range topics {
		list = append(list, tp)
	}
	// waitFor polls the broker's retained state until ok holds.
	waitFor := func(what string, ok func(map[string]string) bool) map[string]string {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			got := map[string]string{}
			if p.Stats().Connected {
				got = retainedOn(t, url, p.AvailabilityTopic(), list)
				if ok(got) {
					return got
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the broker holds %v", what, got)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	obs := func(c *manifest.Capability, v float64) node.Observed {
		return node.Observed{Cap: c, Changed: true, Obs: promcp.Observation{Value: v, Quality: promcp.QualityGood}}
	}
	p.Observe(obs(temp, 21))
	p.Observe(obs(hum, 55))
	p.Alarm(alarms.Event{Capability: hum.ToolName(), Kind: alarms.KindHigh, State: "raised", Message: "55 %, above the high limit 50"})
	waitFor("before the reload", func(g map[string]string) bool {
		return g[topics["hum"]] != "" && g[topics["door"]] != "" && g[topics["hum_obs"]] != "" && g[topics["hum_alarm"]] != "" && g[topics["temp_obs"]] != ""
	})

	p.Reload(m2)
	p.Observe(obs(hum, 56)) // a late observation of the replaced binding
	got := waitFor("after the reload", func(g map[string]string) bool {
		_, hum := g[topics["hum"]]
		_, door := g[topics["door"]]
		_, humObs := g[topics["hum_obs"]]
		_, humAlarm := g[topics["hum_alarm"]]
		return !hum && !door && !humObs && !humAlarm && g[topics["co2"]] != "" && g[topics["door2"]] != "" &&
			strings.Contains(g[topics["temp"]], "°F")
	})
	var c Sensor
	if err := json.Unmarshal([]byte(got[topics["co2"]]), &c); err != nil || c.DeviceClass != "carbon_dioxide" || c.StateTopic != p.StateTopic("read_co2") {
		t.Errorf("co2 discovery config %s (%v)", got[topics["co2"]], err)
	}
	if got[topics["temp_obs"]] == "" || got[topics["mode_disco"]] == "" {
		t.Errorf("a kept capability lost its retained topics: %v", got)
	}
	// The late observation did not come back, and a reconnect publishes
	// the state in force, removals included.
	p.mu.Lock()
	want := p.Stats().Published + uint64(1+len(p.discovery(m2))+len(p.retained)) // availability, configs, retained values
	p.mu.Unlock()
	p.resyncC <- struct{}{}
	for deadline := time.Now().Add(10 * time.Second); p.Stats().Published < want; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the resync published %d of %d messages", p.Stats().Published, want)
		}
	}
	got = retainedOn(t, url, p.AvailabilityTopic(), list)
	if _, ok := got[topics["hum_obs"]]; ok {
		t.Errorf("the removed capability's observation is back on the broker: %v", got)
	}
	if _, ok := got[topics["hum"]]; ok {
		t.Errorf("the removed capability's discovery config is back on the broker: %v", got)
	}
}
