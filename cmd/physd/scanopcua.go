package main

import (
	"context"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/opcua"
	"github.com/physd/physd/strictyaml"
)

const scanOPCUAUsage = `usage: physd scan opcua ENDPOINT [--security-policy None|Basic256Sha256 [--security-mode Sign|SignAndEncrypt]
                         [--server-certificate FILE | --server-trust FILE,... | --server-sha256 HEX]
                         [--certificate FILE --private-key FILE] [--application-uri URI]]
                         [--username NAME --password-env VAR | --user-certificate FILE --user-private-key FILE]
                         [--root NODE] [--depth 6] [--max-nodes 5000] [--timeout 30s] [--timeout-ms N] [--connect-timeout-ms N]
                         [--out FILE [--force]] [--bus plc] [--device-id gw_opcua_001]`

var (
	reScanName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	reDeviceID = regexp.MustCompile(`^[a-z0-9_]+$`) // the manifest's device.id
)

// cmdScanOPCUA is `physd scan opcua ENDPOINT`: browse an OPC UA server's
// address space and write a manifest skeleton. It connects with the
// security and identity a bus entry takes (its flags are the bus keys) and
// sends only Browse and Read requests.
func cmdScanOPCUA(args []string, stdout, stderr io.Writer) int {
	const cmd = "physd scan opcua"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var b opcua.ScanBus
	fs.StringVar(&b.SecurityPolicy, "security-policy", "", "None (the default) or Basic256Sha256")
	fs.StringVar(&b.SecurityMode, "security-mode", "", "Sign or SignAndEncrypt (the default with a policy)")
	fs.StringVar(&b.ServerCertificate, "server-certificate", "", "pin this server certificate (PEM or DER)")
	var trust listFlag
	fs.Var(&trust, "server-trust", "certificates (CAs, or servers' own) the server's must chain to; repeat or comma-separate")
	pinSHA := fs.String("server-sha256", "", "pin the certificate the server presents if its SHA-256 is this; it is saved beside the skeleton")
	fs.StringVar(&b.Certificate, "certificate", "", "physd's application certificate (PEM or DER); generated for the scan if left out")
	fs.StringVar(&b.PrivateKey, "private-key", "", "the application certificate's RSA key")
	fs.StringVar(&b.ApplicationURI, "application-uri", "", "the ApplicationUri physd announces (default: the certificate's)")
	fs.StringVar(&b.Username, "username", "", "user/password identity (anonymous without it)")
	fs.StringVar(&b.PasswordEnv, "password-env", "", "the environment variable that holds the password")
	fs.StringVar(&b.UserCertificate, "user-certificate", "", "an X.509 user identity (needs a security policy)")
	fs.StringVar(&b.UserPrivateKey, "user-private-key", "", "the user certificate's RSA key")
	fs.IntVar(&b.TimeoutMS, "timeout-ms", 0, "the wait for one reply, in ms (the bus's timeout_ms; default 2000)")
	fs.IntVar(&b.ConnectTimeoutMS, "connect-timeout-ms", 0, "the bound on the connect, in ms (the bus's connect_timeout_ms; default 5000)")
	root := fs.String("root", "", "the node to browse from, as a binding writes it (default the Objects folder, i=85)")
	depth := fs.Int("depth", opcua.DefaultScanDepth, "reference levels followed below the root")
	maxNodes := fs.Int("max-nodes", opcua.DefaultScanMaxNodes, "objects, variables and methods recorded at most")
	timeout := fs.Duration("timeout", opcua.DefaultScanTimeout, "bound on the whole scan, connect included; the browse stops at 70% of it")
	out := fs.String("out", "", "write the skeleton to this file instead of stdout")
	force := fs.Bool("force", false, "overwrite --out (and the saved server certificate) if they exist")
	busName := fs.String("bus", "plc", "bus name in the skeleton")
	deviceID := fs.String("device-id", "gw_opcua_001", "device.id in the skeleton")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), scanOPCUAUsage)
		fs.PrintDefaults()
	}

	// ENDPOINT comes first or among the flags: flag stops at the first
	// argument that is not a flag, so parse again after it.
	rest := args
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		b.Endpoint, rest = rest[0], rest[1:]
	}
	if code, ok := parseFlags(fs, rest, stdout, stderr); !ok {
		return code
	}
	if b.Endpoint == "" && fs.NArg() > 0 {
		b.Endpoint = fs.Arg(0)
		if code, ok := parseFlags(fs, fs.Args()[1:], stdout, stderr); !ok {
			return code
		}
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "%s: %s (%s -h lists the flags)\n", cmd, fmt.Sprintf(format, a...), cmd)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return bad("unexpected argument %q: give one ENDPOINT, before or among the flags", fs.Arg(0))
	case b.Endpoint == "":
		return bad("name the server: physd scan opcua opc.tcp://HOST:4840[/PATH] [flags]")
	case !reScanName.MatchString(*busName):
		return bad("--bus %q: use a-z, 0-9 and _, starting with a letter, e.g. plc", *busName)
	case !reDeviceID.MatchString(*deviceID):
		return bad("--device-id %q: use a-z, 0-9 and _, e.g. gw_opcua_001", *deviceID)
	}
	if len(trust) > 0 {
		b.ServerTrust = trust
	}
	o := opcua.ScanOptions{Bus: b, BusName: *busName, Root: *root, Depth: *depth, MaxNodes: *maxNodes, Timeout: *timeout,
		PinSHA256: *pinSHA, Progress: stderr}
	if err := opcua.CheckScanOptions(o); err != nil {
		printScanErrors(cmd, err, stderr)
		return 2
	}
	dir := "."
	if *out != "" {
		dir = filepath.Dir(*out)
		if refuseExistingOut(cmd, *out, *force, stderr) {
			return 1
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	rep, err := opcua.Scan(ctx, o)
	if err != nil {
		printScanErrors(cmd, err, stderr)
		return 1
	}
	if rep.ServerCertificate != nil {
		pinned := filepath.Join(dir, *busName+".server.pem")
		if err := savePEM(pinned, rep.ServerCertificate, *force); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
			return 1
		}
		rep.Bus.ServerCertificate = pinned
		fmt.Fprintf(stderr, "physd scan: saved the server's certificate (sha256 %s) as %s; the skeleton pins it\n", rep.ServerSHA256, pinned)
	}
	skel, n := rep.Skeleton(opcua.SkeletonOptions{DeviceID: *deviceID, At: time.Now(), Dir: dir,
		Command: cmd + " " + strings.Join(args, " ")})
	fmt.Fprintf(stderr, "physd scan: %d node(s), %d variable(s), %d capabilities in the skeleton (%d requests, %.1f s)\n",
		rep.Nodes, len(rep.Variables), n, rep.Requests, rep.Elapsed.Seconds())
	for _, l := range rep.Limits {
		fmt.Fprintf(stderr, "physd scan: %s\n", l)
	}
	return writeSkeleton(cmd, skel, *out, n > 0,
		"no variable could be bound (the skeleton lists each with the reason): browse elsewhere with --root, deeper with --depth, or scan as another user", stdout, stderr)
}

// savePEM writes a certificate as PEM, atomically; an existing file with
// other content is replaced only with force.
func savePEM(path string, der []byte, force bool) error {
	data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if old, err := os.ReadFile(path); err == nil && string(old) != string(data) && !force {
		return fmt.Errorf("%s exists and holds another certificate; fix: move it away, or --force to replace it", path)
	}
	return writeFileAtomic(path, data, 0o644)
}

// scanFlag is the flag of a bus key or scan option.
func scanFlag(key string) string {
	switch key {
	case "":
		return ""
	case "endpoint":
		return "ENDPOINT"
	}
	return "--" + strings.ReplaceAll(key, "_", "-")
}

// keyRE finds the bus keys and scan options named in a message (those
// spelt with '_'; certificate, username and endpoint are also words).
var keyRE = regexp.MustCompile(`\b(security_policy|security_mode|server_certificate|server_trust|server_sha256|private_key|application_uri|password_env|user_certificate|user_private_key|connect_timeout_ms|timeout_ms|max_nodes)\b(: )?`)

// describes reports whether the text after "key: " describes the value
// ("the server's certificate file", an error's text) rather than being
// it: a word in lowercase describes, except a hex string such as a
// SHA-256 ("ee08…"), which is the value.
func describes(after string) bool {
	word, _, _ := strings.Cut(after, " ")
	if word == "" || word[0] < 'a' || word[0] > 'z' {
		return false
	}
	if _, err := hex.DecodeString(word); err == nil && len(word) >= 8 {
		return false
	}
	return true
}

// flagText rewrites the bus keys a driver message names as the flags that
// set them: "add security_policy: Basic256Sha256" → "add
// --security-policy Basic256Sha256" (a key before a description keeps
// its colon: "--password-env: the environment variable …").
func flagText(s string) string {
	var b strings.Builder
	last := 0
	for _, m := range keyRE.FindAllStringSubmatchIndex(s, -1) {
		b.WriteString(s[last:m[0]])
		b.WriteString(scanFlag(s[m[2]:m[3]]))
		if m[4] >= 0 { // "key: "
			if describes(s[m[5]:]) {
				b.WriteString(": ")
			} else {
				b.WriteString(" ")
			}
		}
		last = m[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

// printScanErrors prints each problem on its own line: the flag at fault,
// what is wrong and the fix, in flags.
func printScanErrors(cmd string, err error, stderr io.Writer) {
	for _, e := range leafErrors(err) {
		var se *opcua.ScanError
		var ye *strictyaml.Error
		var key, msg, fix string
		switch {
		case errors.As(e, &ye) && ye.Msg != "":
			key, msg, fix = ye.Field[strings.LastIndex(ye.Field, ".")+1:], ye.Msg, ye.Fix
		case errors.As(e, &se):
			key, msg, fix = se.Key, se.Error(), se.Fix()
		default:
			msg = e.Error()
			_, fix, _ = drivers.CodeOf(e)
		}
		// The driver's file errors begin with "certificate: " or
		// "private_key: " whatever the key: the flag says which.
		msg = strings.TrimPrefix(strings.TrimPrefix(msg, "certificate: "), "private_key: ")
		msg = flagText(strings.TrimRight(msg, ";"))
		if f := scanFlag(key); f != "" {
			switch {
			case strings.HasPrefix(msg, f+" "):
			case strings.HasPrefix(msg, key+" "), strings.HasPrefix(msg, key+":"): // "username needs …"
				msg = f + msg[len(key):]
			default:
				msg = f + ": " + msg
			}
		}
		line := cmd + ": " + msg
		if fix != "" {
			line += "; fix: " + flagText(fix)
		}
		fmt.Fprintln(stderr, line)
	}
}

// leafErrors flattens joined errors (errors.Join, strictyaml.Errors).
func leafErrors(err error) []error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, leafErrors(e)...)
	}
	return out
}
