package fleet

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/physd/physd/manifest"
)

// Flags are physd run's --fleet-* flags: the uplink without a
// network.fleet block, or some of the block's keys replaced. Apply
// merges them.
type Flags struct {
	URLs                   []string
	Site                   string
	Credentials, NKeySeed  string
	User, PasswordFile     string
	CA, Cert, Key          string
	Domain, Stream, Prefix string
	Serve                  []string
	set                    map[string]bool // the flags given
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	f.set = map[string]bool{}
	str := func(p *string, name, usage string) {
		fs.Func(name, usage, func(v string) error {
			*p = v
			f.set[name] = true
			return nil
		})
	}
	fs.Func("fleet-url", "fleet uplink: the hub's (or the site's leaf node's) NATS `URL`, nats://host:4222 or tls://host:4222 (repeatable or comma-separated); replaces network.fleet.urls, or publishes without a network.fleet block (with --fleet-site)", func(v string) error {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				f.URLs = append(f.URLs, s)
			}
		}
		f.set["fleet-url"] = true
		return nil
	})
	str(&f.Site, "fleet-site", "fleet uplink: the site's `NAME`, the second token of every subject; replaces network.fleet.site")
	str(&f.Credentials, "fleet-credentials", "fleet uplink: a NATS .creds `FILE` (user JWT and NKey seed); replaces the manifest's way to authenticate")
	str(&f.NKeySeed, "fleet-nkey-seed", "fleet uplink: a `FILE` holding the user's NKey seed (SU...); replaces the manifest's way to authenticate")
	str(&f.User, "fleet-user", "fleet uplink: the NATS `USER` (password from --fleet-password-file); replaces the manifest's way to authenticate")
	str(&f.PasswordFile, "fleet-password-file", "fleet uplink: the `FILE` holding --fleet-user's (or network.fleet.user's) password")
	str(&f.CA, "fleet-ca", "fleet uplink: PEM CA certificate `FILE` that verifies the hub (tls:// URLs); replaces network.fleet.tls.ca")
	str(&f.Cert, "fleet-cert", "fleet uplink: PEM client certificate `FILE` (with --fleet-key); replaces network.fleet.tls.cert and key")
	str(&f.Key, "fleet-key", "fleet uplink: the private key `FILE` of --fleet-cert (PEM)")
	str(&f.Domain, "fleet-domain", "fleet uplink: the hub's JetStream `DOMAIN` (needed at a leaf node that runs JetStream itself); replaces network.fleet.domain")
	str(&f.Stream, "fleet-stream", "fleet uplink: the JetStream `STREAM` of the audit records (default "+manifest.DefaultFleetStream+"); replaces network.fleet.stream")
	fs.Func("fleet-serve", "fleet uplink: what the gateway answers the fleet endpoint over NATS, a comma-separated `LIST` of read, can_do and do (none: nothing); replaces network.fleet.serve (default read,can_do)", func(v string) error {
		f.Serve = []string{}
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" && s != "none" {
				f.Serve = append(f.Serve, s)
			}
		}
		f.set["fleet-serve"] = true
		return nil
	})
	str(&f.Prefix, "fleet-prefix", "fleet uplink: the first token(s) of every subject, `PREFIX` (default "+manifest.DefaultFleetSubjectPrefix+"); replaces network.fleet.subject_prefix")
}

// Given reports whether any --fleet-* flag was given.
func (f *Flags) Given() bool { return len(f.set) > 0 }

// given lists the flags given, in a stable order (for messages).
func (f *Flags) given() []string {
	var out []string
	for _, n := range []string{"fleet-url", "fleet-site", "fleet-credentials", "fleet-nkey-seed", "fleet-user", "fleet-password-file",
		"fleet-ca", "fleet-cert", "fleet-key", "fleet-domain", "fleet-stream", "fleet-prefix", "fleet-serve"} {
		if f.set[n] {
			out = append(out, "--"+n)
		}
	}
	return out
}

// Apply is network.fleet with the flags applied: each flag given
// replaces its key (an authentication flag replaces the manifest's way to
// authenticate, --fleet-cert and --fleet-key replace the client
// certificate); without a network.fleet block, --fleet-url and
// --fleet-site make one with every default. Errors name the flag and
// the fix. m is not changed; with no flag given it is returned as is.
func (f *Flags) Apply(m *manifest.Fleet) (*manifest.Fleet, error) {
	if !f.Given() {
		return m, nil
	}
	first := f.given()[0]
	if m != nil && !m.Enabled {
		return nil, fmt.Errorf("%s: the manifest turns the fleet uplink off (network.fleet.enabled: false); fix: remove enabled: false from the manifest, or drop the --fleet-* flags", first)
	}
	var out manifest.Fleet
	if m == nil {
		if !f.set["fleet-url"] || !f.set["fleet-site"] {
			missing := "--fleet-url"
			if f.set["fleet-url"] {
				missing = "--fleet-site"
			}
			return nil, fmt.Errorf("%s: the manifest has no network.fleet block, so %s is needed too; fix: give --fleet-url nats://hub:4222 and --fleet-site NAME, or a network.fleet block in the manifest", first, missing)
		}
		out = *manifest.DefaultFleet()
	} else {
		out = *m
		out.URLs = append([]string(nil), m.URLs...)
		out.Serve = slices.Clone(m.Serve)
	}
	if f.set["fleet-serve"] {
		seen := map[string]bool{}
		for _, s := range f.Serve {
			switch {
			case !slices.Contains(manifest.FleetServes, s):
				return nil, fmt.Errorf("--fleet-serve: unknown %q; fix: a comma-separated list of %s (or none)", s, strings.Join(manifest.FleetServes, ", "))
			case seen[s]:
				return nil, fmt.Errorf("--fleet-serve: %q is listed twice; fix: name each once", s)
			}
			seen[s] = true
		}
		out.Serve = slices.Clone(f.Serve)
	}

	if f.set["fleet-url"] {
		if len(f.URLs) == 0 {
			return nil, fmt.Errorf("--fleet-url: no URL; fix: --fleet-url nats://hub:4222")
		}
		for _, u := range f.URLs {
			if !manifest.IsFleetURL(u) {
				return nil, fmt.Errorf("--fleet-url %q: not a NATS URL physd takes; fix: nats://host:4222 or tls://host:4222 (credentials go in --fleet-credentials, --fleet-nkey-seed or --fleet-user with --fleet-password-file, never in the URL)", u)
			}
		}
		out.URLs = f.URLs
	}
	for _, t := range []struct {
		flag, v, what, example string
		ok                     func(string) bool
		into                   *string
	}{
		{"fleet-site", f.Site, "one NATS subject token: letters, digits, _ and -", "greenhouse-north", manifest.IsSubjectToken, &out.Site},
		{"fleet-domain", f.Domain, "the hub's jetstream.domain: letters, digits, _ and -", "hub", manifest.IsSubjectToken, &out.Domain},
		{"fleet-stream", f.Stream, "a stream name: letters, digits, _ and -", manifest.DefaultFleetStream, manifest.IsStreamName, &out.Stream},
		{"fleet-prefix", f.Prefix, "dot-separated tokens of letters, digits, _ and -", "acme.physd", manifest.IsSubjectPrefix, &out.SubjectPrefix},
	} {
		if !f.set[t.flag] {
			continue
		}
		if !t.ok(t.v) {
			return nil, fmt.Errorf("--%s %q: %s; fix: e.g. --%s %s", t.flag, t.v, t.what, t.flag, t.example)
		}
		*t.into = t.v
	}

	// Authentication: at most one way among the flags; a flag's way
	// replaces the manifest's.
	var ways []string
	for _, n := range []string{"fleet-credentials", "fleet-nkey-seed", "fleet-user"} {
		if f.set[n] {
			ways = append(ways, "--"+n)
		}
	}
	if len(ways) > 1 {
		return nil, fmt.Errorf("%s and %s are two ways to authenticate; fix: keep one", ways[0], ways[1])
	}
	if len(ways) == 1 {
		out.CredentialsFile, out.NKeySeedFile, out.User, out.PasswordFile = f.Credentials, f.NKeySeed, f.User, ""
		for _, v := range []struct{ flag, v string }{{"fleet-credentials", f.Credentials}, {"fleet-nkey-seed", f.NKeySeed}, {"fleet-user", f.User}} {
			if f.set[v.flag] && v.v == "" {
				return nil, fmt.Errorf("--%s is empty; fix: give its value, or leave the flag out", v.flag)
			}
		}
	}
	if f.set["fleet-password-file"] {
		if out.User == "" {
			why := "no user is given"
			if out.CredentialsFile != "" || out.NKeySeedFile != "" {
				why = "the uplink authenticates with a credentials or NKey seed file"
			}
			return nil, fmt.Errorf("--fleet-password-file: %s; fix: add --fleet-user NAME", why)
		}
		out.PasswordFile = f.PasswordFile
	}

	// TLS.
	if f.set["fleet-cert"] != f.set["fleet-key"] {
		return nil, fmt.Errorf("--fleet-cert and --fleet-key go together; fix: give both (the client certificate and its private key), or neither")
	}
	if f.set["fleet-cert"] {
		out.TLSCert, out.TLSKey = f.Cert, f.Key
	}
	if f.set["fleet-ca"] {
		out.TLSCA = f.CA
	}
	if out.TLSCA != "" || out.TLSCert != "" {
		for _, u := range out.URLs {
			if !strings.HasPrefix(u, "nats://") {
				continue
			}
			if f.set["fleet-url"] {
				return nil, fmt.Errorf("--fleet-url %s: a plain URL with TLS set (--fleet-ca, --fleet-cert or network.fleet.tls); fix: --fleet-url tls://%s", u, strings.TrimPrefix(u, "nats://"))
			}
			tlsFlag := "--fleet-ca"
			if f.set["fleet-cert"] {
				tlsFlag = "--fleet-cert"
			}
			return nil, fmt.Errorf("%s: TLS with the plain URL %s of network.fleet.urls; fix: use tls:// URLs (in the manifest or --fleet-url)", tlsFlag, u)
		}
	}
	// The files a flag names are read at start: a wrong path is the
	// flag's error, not the manifest's.
	for _, v := range []struct{ flag, path string }{{"fleet-credentials", f.Credentials}, {"fleet-nkey-seed", f.NKeySeed},
		{"fleet-password-file", f.PasswordFile}, {"fleet-ca", f.CA}, {"fleet-cert", f.Cert}, {"fleet-key", f.Key}} {
		if !f.set[v.flag] {
			continue
		}
		if _, err := os.Stat(v.path); err != nil {
			return nil, fmt.Errorf("--%s: %w; fix: the path of a file physd can read (it is read at start)", v.flag, err)
		}
	}
	return &out, nil
}
