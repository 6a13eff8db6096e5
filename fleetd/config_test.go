package fleetd

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigExample(t *testing.T) {
	c, err := LoadConfig(filepath.Join("..", "examples", "fleet", "fleet.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.ID != "fleet_hq" || c.Embed == nil || len(c.Embed.Sites) != 3 || c.CallTimeout != 2*time.Second || len(c.Views) != 2 {
		t.Fatalf("%+v", c)
	}
	if p := c.Embed.Sites[0].PasswordFile; !strings.HasSuffix(p, filepath.Join("examples", "fleet", "secrets", "east.pw")) {
		t.Errorf("a site's password file is not relative to the config file: %s", p)
	}
	if v := c.Views[0]; v.Name != "north" || len(v.Sites) != 1 || v.Sites[0] != "north" {
		t.Errorf("view %+v", v)
	}
	if c.HistoryStream != "PHYSD_HISTORY" || c.AlarmStream != "PHYSD_ALARMS" {
		t.Errorf("the history and alarm streams' defaults: %q %q", c.HistoryStream, c.AlarmStream)
	}
	c, err = ParseConfig("f.yml", []byte("history_stream: H\nalarm_stream: A\nnats: {urls: [nats://h:4222], domain: hub}\n"))
	if err != nil || c.HistoryStream != "H" || c.AlarmStream != "A" || c.NATS.Domain != "hub" {
		t.Errorf("history_stream, alarm_stream, nats.domain: %+v %v", c, err)
	}
}

// TestConfigErrors: every problem is named with file:line:col, the field
// and a fix; unknown keys get a did-you-mean.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"idd: x\n", `f.yml:1:1: idd: unknown key "idd"; fix: did you mean "id"?`},
		{"id: Fleet HQ\n", `f.yml:1:5: id: invalid id "Fleet HQ"`},
		{"call_timeout_ms: 10\n", `f.yml:1:18: call_timeout_ms: 10 is out of range`},
		{"call_timeout_ms: 20000\n", `do_timeout_ms must be longer than call_timeout_ms`},
		{"nats: {urls: [nats://h:4222]}\nembed: {sites: {a: {password_file: p}}}\n", `f.yml:2:1: embed: nats and embed are two hubs`},
		{"nats: {urls: [\"http://h\"]}\n", `f.yml:1:14: nats.urls.0: invalid NATS URL "http://h"`},
		{"nats: {urls: [nats://h:4222], user: u, credentials_file: c}\n", `nats: two ways to authenticate`},
		{"embed: {listen: 0.0.0.0:4222, sites: {a: {password_file: p}}}\n", `embed.listen: listen "0.0.0.0:4222" is off loopback without TLS`},
		{"embed: {sites: {a: {}}}\n", `embed.sites.a: one of password_file or nkey`},
		{"embed: {sites: {\"a.b\": {password_file: p}}}\n", `embed.sites.a.b: invalid site name "a.b"`},
		{"embed: {}\n", `embed.sites: no sites`},
		{"views: {v: {kinds: [write]}}\n", `f.yml:1:20: views.v.kinds.0: unknown kind "write"; fix: use one of read, do`},
		{"views: {v: {capabilities: [do_heater]}}\n", `views.v.capabilities.0: "do_heater" is a tool name`},
		{"views: {V: {}}\n", `invalid view name "V"`},
		{"views: {v: {site: [north]}}\n", `unknown key "site"; fix: did you mean "sites"?`},
		{"nats: {urls: [nats://h:4222], domain: \"a.b\"}\n", `nats.domain: invalid domain "a.b"`},
		{"history_stream: \"a b\"\n", `history_stream: invalid stream name "a b"`},
	} {
		_, err := ParseConfig("f.yml", []byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q:\n got  %v\n want %s", tc.yaml, err, tc.want)
		}
	}
}
