package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/physd/physd/daemon"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/policy"
)

// checked is what `physd run` has validated before it starts anything: the
// manifest (with its bindings checked as validate checks them), the policy
// and its gate, and the state directory.
type checked struct {
	manifest *manifest.Manifest
	policy   *policy.Policy // nil without --policy
	gate     *gate.Gate
	stateDir string
	// sum is the manifest file's content that was checked (what a
	// --watch-manifest compares the file with).
	sum [32]byte
}

// preflight checks the files `physd run` was given exactly as `physd
// validate` does and prints every problem the same way (one per line,
// file:line:col, on stderr), before the JSON log starts: an operator reads
// them as text, not as one escaped log field. It returns the exit code
// when run must not start.
func preflight(f runFlags, stderr io.Writer) (*checked, int) {
	if f.manifest == "" {
		fmt.Fprintln(stderr, "physd run: --manifest is required; fix: physd run --manifest /etc/physd/physmcp.manifest.yml")
		return nil, 2
	}
	data, err := os.ReadFile(f.manifest)
	if err != nil {
		fmt.Fprintln(stderr, "physd run:", fileError("--manifest", f.manifest, err, fixManifest))
		return nil, 1
	}
	m, err := daemon.ParseManifest(f.manifest, data)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, 1
	}
	if err := daemon.CheckMDNS(f.mdns.iface, m); err != nil {
		fmt.Fprintln(stderr, err)
		return nil, 1
	}
	c := &checked{manifest: m, sum: sha256.Sum256(data)}
	if f.policy != "" {
		if c.policy, c.gate, err = loadPolicy(f.policy, m); err != nil {
			fmt.Fprintln(stderr, prefixed("physd run", err))
			return nil, 1
		}
	}
	if c.stateDir, err = stateDir(f, m.Device.ID); err != nil {
		fmt.Fprintln(stderr, err)
		return nil, 1
	}
	return c, 0
}

// loadManifest parses the manifest and checks every binding offline, the
// one check both validate and run apply; what names where the path came
// from (a flag, or "manifest" for an argument).
func loadManifest(what, path string) (*manifest.Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fileError(what, path, err, fixManifest)
	}
	return daemon.ParseManifest(path, data)
}

// loadPolicy is daemon.LoadPolicy for this build, its file named as the
// --policy flag that gave it.
func loadPolicy(path string, m *manifest.Manifest) (*policy.Policy, *gate.Gate, error) {
	p, g, err := daemon.LoadPolicy(path, m, buildVersion())
	return p, g, fileError("--policy", path, err, fixPolicy)
}

// errNoStateDir says why physd will not pick a state directory by itself.
var errNoStateDir = errors.New("physd run: no state directory: $HOME is unset and none of --state, $STATE_DIRECTORY or $XDG_STATE_HOME is given, " +
	"and the idempotency ledger and audit trail must survive a reboot; " +
	"fix: pass --state /var/lib/physd (systemd's StateDirectory= sets $STATE_DIRECTORY), " +
	"or --state-in-tmp to accept the temporary directory ($TMPDIR or /tmp), which is lost at reboot")

// stateDir picks the ledger and audit directory: --state, then
// $STATE_DIRECTORY (systemd), $XDG_STATE_HOME, ~/.local/state. It refuses
// to fall back to the temporary directory unless asked (--state-in-tmp):
// a ledger lost at reboot lets an agent's retried key actuate twice.
func stateDir(f runFlags, deviceID string) (string, error) {
	if f.state != "" {
		return f.state, nil
	}
	if d := os.Getenv("STATE_DIRECTORY"); d != "" {
		return d, nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "physd", deviceID), nil
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "physd", deviceID), nil
	}
	if f.stateInTmp {
		return filepath.Join(os.TempDir(), "physd", deviceID), nil
	}
	return "", errNoStateDir
}

// parseFlags parses a subcommand's flags. -h/--help prints the flags on
// stdout and ends the command with exit code 0; a bad flag prints the
// problem on one line on stderr, with a "did you mean" for a misspelt
// flag (exit code 2). ok is false when the
// command must end with code.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	var out bytes.Buffer
	fs.SetOutput(&out)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		_, _ = stdout.Write(out.Bytes())
		return 0, false
	case err != nil:
		flagError(fs, err, stderr)
		return 2, false
	}
	return 0, true
}
