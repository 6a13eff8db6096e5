package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// chromium finds Debian's headless browser; .ci/run installs it. Without
// it (a developer machine) the test is skipped, and says so.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed; .ci/run must install Debian's chromium package")
	}
	t.Skip("chromium not installed (apt-get install chromium)")
	return ""
}

// TestStatusPageInChromium renders / in headless Chromium and checks the
// rendered DOM shows the device and the example's capabilities.
func TestStatusPageInChromium(t *testing.T) {
	bin := chromium(t)
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	call(t, cs, "read_temperature_zone_a", nil)
	call(t, cs, "do_fan_zone_b", map[string]any{"value": 33, "idempotency_key": "page-1"})

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(), "--virtual-time-budget=2000", "--dump-dom", d.url("/"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	dom := string(out)
	for _, want := range []string{`id="device">gw_greenhouse_001<`, "read_temperature_zone_a", "do_fan_zone_b", "read_rain_tank_level", `class="success">success<`, "ready"} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
	if n := strings.Count(dom, `<tr id="cap-`); n != 13 {
		t.Errorf("expected a row per capability (13), got %d rows", n)
	}
}
