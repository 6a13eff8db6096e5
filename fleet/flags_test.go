package fleet

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/physd/physd/manifest"
)

func parseFlags(t *testing.T, args ...string) *Flags {
	t.Helper()
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f Flags
	f.Register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &f
}

// TestFlagsApply: the --fleet-* flags make a block with every default
// when the manifest has none, and replace the keys they name when it has
// one (an authentication flag the whole way to authenticate).
func TestFlagsApply(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	creds, pw, ca := file("site.creds"), file("pw"), file("ca.pem")

	if got, err := parseFlags(t).Apply(nil); err != nil || got != nil {
		t.Errorf("no flag, no block: %+v %v", got, err)
	}
	m := &manifest.Fleet{Enabled: true, URLs: []string{"nats://a:4222"}, Site: "north", User: "gw", PasswordFile: pw,
		Stream: "S", SubjectPrefix: "physd", History: true, HistoryStream: "H", ConnectTimeoutMS: 1000, PublishTimeoutMS: 2000}
	if got, err := parseFlags(t).Apply(m); err != nil || got != m {
		t.Errorf("no flag: %+v %v, want the manifest's block itself", got, err)
	}

	got, err := parseFlags(t, "--fleet-url", "nats://leaf:4222,nats://leaf2:4222", "--fleet-site", "south", "--fleet-credentials", creds, "--fleet-domain", "hub").Apply(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := manifest.DefaultFleet()
	want.URLs, want.Site, want.CredentialsFile, want.Domain = []string{"nats://leaf:4222", "nats://leaf2:4222"}, "south", creds, "hub"
	if !reflect.DeepEqual(got, want) || !slices.Equal(got.Serve, []string{"read", "can_do"}) {
		t.Errorf("without a block:\n %+v\nwant\n %+v", got, want)
	}
	// --fleet-serve replaces network.fleet.serve; none serves nothing.
	got, err = parseFlags(t, "--fleet-url", "nats://leaf:4222", "--fleet-site", "south", "--fleet-serve", "read,can_do,do").Apply(nil)
	if err != nil || !slices.Equal(got.Serve, []string{"read", "can_do", "do"}) {
		t.Errorf("--fleet-serve read,can_do,do: %+v %v", got, err)
	}
	if got, err := parseFlags(t, "--fleet-serve", "none").Apply(&manifest.Fleet{Enabled: true, URLs: []string{"nats://a:4222"}, Site: "north", Serve: []string{"read"}}); err != nil || got.Serve == nil || len(got.Serve) != 0 {
		t.Errorf("--fleet-serve none: %+v %v", got, err)
	}

	got, err = parseFlags(t, "--fleet-site", "south", "--fleet-credentials", creds, "--fleet-url", "tls://hub:4222", "--fleet-ca", ca, "--fleet-prefix", "acme.physd").Apply(m)
	if err != nil {
		t.Fatal(err)
	}
	want = &manifest.Fleet{Enabled: true, URLs: []string{"tls://hub:4222"}, Site: "south", CredentialsFile: creds, TLSCA: ca,
		Stream: "S", SubjectPrefix: "acme.physd", History: true, HistoryStream: "H", ConnectTimeoutMS: 1000, PublishTimeoutMS: 2000}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("over a block:\n %+v\nwant\n %+v", got, want)
	}
	if m.Site != "north" || m.User != "gw" || m.URLs[0] != "nats://a:4222" {
		t.Errorf("Apply changed the manifest's block: %+v", m)
	}
	// The password file alone keeps the manifest's user.
	if got, err := parseFlags(t, "--fleet-password-file", ca).Apply(m); err != nil || got.User != "gw" || got.PasswordFile != ca {
		t.Errorf("--fleet-password-file over user: %+v %v", got, err)
	}
}

func TestFlagsErrors(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "site.creds")
	os.WriteFile(creds, []byte("x"), 0o600)
	missing := filepath.Join(dir, "none")
	block := &manifest.Fleet{Enabled: true, URLs: []string{"nats://a:4222"}, Site: "north", CredentialsFile: creds, Stream: "S", SubjectPrefix: "physd"}
	off := &manifest.Fleet{Enabled: false, URLs: []string{"nats://a:4222"}, Site: "north"}
	for _, tc := range []struct {
		args []string
		m    *manifest.Fleet
		want string
	}{
		{[]string{"--fleet-site", "north"}, nil, "--fleet-site: the manifest has no network.fleet block, so --fleet-url is needed too; fix: give --fleet-url nats://hub:4222 and --fleet-site NAME"},
		{[]string{"--fleet-url", "nats://h:4222"}, nil, "so --fleet-site is needed too"},
		{[]string{"--fleet-url", "nats://h:4222"}, off, "--fleet-url: the manifest turns the fleet uplink off (network.fleet.enabled: false); fix:"},
		{[]string{"--fleet-url", "http://h:4222"}, block, `--fleet-url "http://h:4222": not a NATS URL physd takes; fix: nats://host:4222 or tls://host:4222`},
		{[]string{"--fleet-url", "nats://u:p@h:4222"}, block, "never in the URL"},
		{[]string{"--fleet-site", "a.b"}, block, `--fleet-site "a.b": one NATS subject token: letters, digits, _ and -; fix: e.g. --fleet-site greenhouse-north`},
		{[]string{"--fleet-domain", "a*"}, block, `--fleet-domain "a*"`},
		{[]string{"--fleet-stream", "a b"}, block, `--fleet-stream "a b"`},
		{[]string{"--fleet-prefix", "a.>"}, block, `--fleet-prefix "a.>"`},
		{[]string{"--fleet-user", "u", "--fleet-credentials", creds}, block, "--fleet-credentials and --fleet-user are two ways to authenticate; fix: keep one"},
		{[]string{"--fleet-password-file", creds}, block, "--fleet-password-file: the uplink authenticates with a credentials or NKey seed file; fix: add --fleet-user NAME"},
		{[]string{"--fleet-cert", creds}, block, "--fleet-cert and --fleet-key go together"},
		{[]string{"--fleet-ca", creds}, block, "--fleet-ca: TLS with the plain URL nats://a:4222 of network.fleet.urls; fix: use tls:// URLs"},
		{[]string{"--fleet-ca", creds, "--fleet-url", "nats://h:4222"}, block, "--fleet-url nats://h:4222: a plain URL with TLS set (--fleet-ca, --fleet-cert or network.fleet.tls); fix: --fleet-url tls://h:4222"},
		{[]string{"--fleet-credentials", missing}, block, "--fleet-credentials: stat " + missing + ": no such file or directory; fix: the path of a file physd can read"},
		{[]string{"--fleet-user", ""}, block, "--fleet-user is empty"},
		{[]string{"--fleet-serve", "read,write"}, block, `--fleet-serve: unknown "write"; fix: a comma-separated list of read, can_do, do (or none)`},
		{[]string{"--fleet-serve", "do,do"}, block, `--fleet-serve: "do" is listed twice`},
	} {
		_, err := parseFlags(t, tc.args...).Apply(tc.m)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v:\n got  %v\n want %s", tc.args, err, tc.want)
		}
	}
}
