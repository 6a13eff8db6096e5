// Command physd is the PhysMCP edge daemon: it serves a device manifest's
// capabilities as proMCP tools over MCP (loopback HTTP and stdio).
//
//	physd run --manifest FILE [--policy FILE] [--http ADDR | --stdio] [--state DIR]
//	physd fleet --config FILE [--policy FILE] [--http ADDR] [--embed ADDR]
//	physd validate [--policy FILE] MANIFEST
//	physd lint …
//	physd client-config --manifest FILE [--client KIND] [--transport stdio|http]
//	physd audit verify STATE_DIR
//	physd scan modbus (--tcp HOST:PORT | --rtu DEVICE) [--units 1-247] [--out FILE]
//	physd scan i2c [--bus 1] [--out FILE]
//	physd scan opcua ENDPOINT [--security-policy P] [--root NODE] [--depth 6] [--out FILE]
//	physd version
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	_ "time/tzdata" // time windows name IANA zones; gateways often lack tzdata

	"github.com/physd/physd/daemon"
	_ "github.com/physd/physd/drivers/all" // every bus driver (the one list)
	"github.com/physd/physd/manifest"
)

// version is set with -ldflags "-X main.version=…" by release builds.
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `physd — PhysMCP edge daemon

Usage:
  physd run --manifest FILE [--policy FILE] [--http ADDR | --stdio] [--state DIR]
  physd fleet --config FILE [--policy FILE] [--http ADDR] [--embed ADDR] [--state DIR]
  physd validate [--policy POLICY] MANIFEST
  physd lint [--json] [--strict] [--allow-do] [--header "K: V"] <URL | tools.json | -- COMMAND...>
  physd client-config --manifest FILE [--client claude-desktop|vscode|cursor] [--transport stdio|http]
  physd audit verify STATE_DIR
  physd scan modbus (--tcp HOST:PORT | --rtu DEVICE) [--units 1-247] [--out FILE]
  physd scan i2c [--bus 1] [--out FILE]
  physd scan opcua ENDPOINT [--security-policy P] [--root NODE] [--depth 6] [--out FILE]
  physd version

Run "physd run -h" (or any command with -h) for its flags.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "fleet":
		return cmdFleet(args[1:], stdout, stderr)
	case "validate":
		return cmdValidate(args[1:], stdout, stderr)
	case "lint":
		return cmdLint(args[1:], stdout, stderr)
	case "client-config":
		return cmdClientConfig(args[1:], stdout, stderr)
	case "audit":
		return cmdAudit(args[1:], stdout, stderr)
	case "scan":
		return cmdScan(args[1:], stdout, stderr)
	case "version", "--version", "-v":
		writeVersion(stdout)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintln(stderr, unknownCommand(args[0]))
	return 2
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func cmdValidate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("physd validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	policyPath := fs.String("policy", "", "also check this physmcp.policy.yml against the manifest")
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: physd validate [--policy POLICY] MANIFEST")
		return 2
	}
	args = fs.Args()
	m, err := loadManifest("manifest", args[0])
	if err != nil {
		fmt.Fprintln(stderr, prefixed("physd validate", err))
		return 1
	}
	reads, dos := 0, 0
	for _, c := range m.Capabilities {
		if c.Kind == manifest.KindRead {
			reads++
		} else {
			dos++
		}
	}
	fmt.Fprintf(stdout, "%s: ok (device %s, %d read and %d do capabilities, %d buses)\n", args[0], m.Device.ID, reads, dos, len(m.Buses))
	daemon.WriteTools(m, stdout, stderr)
	daemon.WriteViews(m, stdout, stderr)
	if *policyPath != "" {
		pol, g, err := loadPolicy(*policyPath, m)
		if err != nil {
			fmt.Fprintln(stderr, prefixed("physd validate", err))
			return 1
		}
		for _, w := range daemon.PolicyWarnings(pol, g) {
			fmt.Fprintln(stderr, "warning:", w)
		}
		ids := len(pol.Identity.Tokens) + len(pol.Identity.JWT)
		if o := pol.Identity.OAuth; o != nil {
			ids += len(o.Servers) // each authorization server is an identity source
		}
		fmt.Fprintf(stdout, "%s: ok (%d do_ tools guarded, %d time windows, %d identities)\n", *policyPath, len(pol.Tools), len(pol.Windows), ids)
	}
	return 0
}
