package opcua

import (
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestREADMEBusReference: the bus table of docs/manifest.md's OPC UA
// section names every bus key the parser accepts, and its millisecond
// defaults are DefaultConfig's.
func TestREADMEBusReference(t *testing.T) {
	b, err := os.ReadFile("../../docs/manifest.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "### OPC UA")
	if i < 0 {
		t.Fatal("docs/manifest.md has no ### OPC UA section")
	}
	sec := doc[i:]
	if j := strings.Index(sec[3:], "\n### "); j >= 0 {
		sec = sec[:j+3]
	}
	rows := map[string]string{} // key -> default column
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		for _, k := range strings.Split(cells[1], ",") {
			rows[strings.Trim(strings.TrimSpace(k), "`")] = strings.TrimSpace(cells[2])
		}
	}
	kt := reflect.TypeOf(busKeys{})
	for i := range kt.NumField() {
		key := strings.Split(kt.Field(i).Tag.Get("yaml"), ",")[0]
		if _, ok := rows[key]; !ok {
			t.Errorf("bus key %s is not in the docs/manifest.md OPC UA table", key)
		}
	}
	d := DefaultConfig()
	for key, want := range map[string]time.Duration{"timeout_ms": d.Timeout, "connect_timeout_ms": d.ConnectTimeout, "reconnect_backoff_ms": d.Reconnect, "keepalive_ms": d.KeepAlive} {
		if got := rows[key]; got != strconv.FormatInt(want.Milliseconds(), 10) {
			t.Errorf("docs/manifest.md: %s default %q, DefaultConfig has %d", key, got, want.Milliseconds())
		}
	}
}
