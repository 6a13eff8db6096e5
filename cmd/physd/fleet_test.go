package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFleetCommandLine: physd fleet's own mistakes are one line each,
// naming the flag or the file and the fix, before anything starts.
func TestFleetCommandLine(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "fleet.yml")
	if err := os.WriteFile(bad, []byte("id: fleet\nembed:\n  lisen: 127.0.0.1:4222\n  sites: {north: {password_file: n.pw}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cluster := filepath.Join(dir, "cluster.yml")
	if err := os.WriteFile(cluster, []byte("nats: {urls: [nats://127.0.0.1:1]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	none := filepath.Join(dir, "none.yml")
	if err := os.WriteFile(none, []byte("id: fleet\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"fleet"}, 2, "physd fleet: --config is required; fix: physd fleet --config /etc/physd/fleet.yml"},
		{[]string{"fleet", "--conifg", "x"}, 2, "physd fleet: unknown flag --conifg; did you mean --config? (physd fleet -h lists the flags)"},
		{[]string{"fleet", "--config", filepath.Join(dir, "missing.yml")}, 1, "--config"},
		{[]string{"fleet", "--config", bad}, 1, `fleet.yml:3:3: embed.lisen: unknown key "lisen"; fix: did you mean "listen"?`},
		{[]string{"fleet", "--config", cluster, "--embed", "127.0.0.1:4222"}, 2, "--embed 127.0.0.1:4222: " + cluster + " connects to an external cluster (nats:)"},
		{[]string{"fleet", "--config", none, "--state", dir}, 2, "names no hub; fix: add nats:"},
		{[]string{"fleet", "--config", none, "--families", "some"}, 2, `--families "some": use auto, on or off`},
		{[]string{"flet"}, 2, `physd: unknown command "flet"; did you mean "fleet"?`},
	} {
		code, _, stderr := runCLI(tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") > 0 {
			t.Errorf("physd %s: exit %d, stderr:\n%s\nwant exit %d and one line with %q", strings.Join(tc.args, " "), code, stderr, tc.code, tc.want)
		}
	}
}
