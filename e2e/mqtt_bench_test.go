package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkMQTTDo measures a do_ over HTTP against one physd publishing to
// mosquitto, with the broker up and then killed (the same daemon, the same
// run): a dead broker must cost the do_ nothing.
//
//	PHYSD_E2E_NORACE=1 go test ./e2e -run '^$' -bench BenchmarkMQTTDo -benchtime 300x -count 3
func BenchmarkMQTTDo(b *testing.B) {
	br := startBroker(b)
	dir := b.TempDir()
	man := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(man, []byte(observedManifest), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(physdBin, "run", "--manifest", man, "--state", filepath.Join(dir, "state"), "--http", "127.0.0.1:0",
		"--mqtt-url", br.url())
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }()
	addr := benchLogValue(b, stderr, "listening", "addr")
	c := mcp.NewClient(&mcp.Implementation{Name: "mqtt-bench", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp"}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	n := 0
	do := func(b *testing.B) {
		for b.Loop() {
			n++
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_a",
				Arguments: map[string]any{"value": 10 + n%2*20, "idempotency_key": fmt.Sprintf("bench-%d", n)}})
			if err != nil || res.IsError {
				b.Fatalf("do_: %v %+v", err, res)
			}
		}
	}
	metric := func(name string) string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, name+" ") {
				return strings.TrimPrefix(l, name+" ")
			}
		}
		return "?"
	}
	deadline := time.Now().Add(15 * time.Second)
	for metric("physd_mqtt_connected") != "1" {
		if time.Now().After(deadline) {
			b.Fatal("physd did not connect to mosquitto")
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Run("broker_up", do)
	br.stop()
	for metric("physd_mqtt_connected") != "0" {
		time.Sleep(50 * time.Millisecond)
	}
	b.Run("broker_down", do)
	b.Logf("published %s, dropped %s", metric("physd_mqtt_published"), metric("physd_mqtt_dropped"))
}

func benchLogValue(b testing.TB, buf *syncBuffer, msg, key string) string {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		sc := bufio.NewScanner(strings.NewReader(buf.String()))
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == msg {
				return fmt.Sprint(line[key])
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Fatalf("no %q log line; stderr:\n%s", msg, buf.String())
	return ""
}
