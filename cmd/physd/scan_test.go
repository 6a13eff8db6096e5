package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/creack/pty"
	"github.com/physd/physd/drivers/modbus/modbustest"
)

// TestScanModbusRTU: `physd scan modbus --rtu` against the RTU slave on a
// pty finds the two units that answer, writes a skeleton that `physd
// validate` accepts and that names each unit, and sends only reads.
func TestScanModbusRTU(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	bank := modbustest.NewBank(8)
	slave := modbustest.ServeRTU(ptmx, bank, 3, 7)
	t.Cleanup(func() {
		_ = tty.Close()
		<-slave.Done()
		_ = ptmx.Close()
	})
	bank.SetIdent(7, "ACME", "VFD-9", "2.1")
	bank.SetHolding(3, 0, 1234)
	out := filepath.Join(t.TempDir(), "skel.yml")
	var stdout, stderr bytes.Buffer
	code := run([]string{"scan", "modbus", "--rtu", tty.Name(), "--baud", "115200", "--parity", "N", "--stop-bits", "2",
		"--units", "1-8", "--timeout-ms", "150", "--silence-ms", "20", "--registers", "0-31", "--out", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("scan exit %d: %s", code, stderr.String())
	}
	for _, r := range bank.Requests() {
		if r.Write {
			t.Fatalf("scan wrote: %+v", r)
		}
	}
	if !strings.Contains(stderr.String(), "2 of 8 unit(s) answered") {
		t.Fatalf("stderr: %s", stderr.String())
	}
	skel, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range []string{"# ==== unit 3: no identification", `# ==== unit 7: VendorName "ACME", ProductCode "VFD-9", MajorMinorRevision "2.1"`,
		"- name: u3_holding_0", "read 1234 at scan time", "- name: u7_discrete_7", "port: \"" + tty.Name() + "\""} {
		if !strings.Contains(string(skel), part) {
			t.Errorf("skeleton lacks %q", part)
		}
	}
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"validate", out}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "64 read and 0 do capabilities") {
		t.Fatalf("validate exit %d: %s%s", code, stdout.String(), stderr.String())
	}
}

// TestScanModbusFlags: bad flags are refused with the flag named, before
// anything is opened.
func TestScanModbusFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"scan"}, "name the bus kind"},
		{[]string{"scan", "modbus"}, "exactly one of --tcp"},
		{[]string{"scan", "modbus", "--tcp", "h:1", "--rtu", "/dev/x"}, "exactly one of --tcp"},
		{[]string{"scan", "modbus", "--rtu", "/dev/x", "--units", "0-10"}, `--units 0-10: "0-10" must lie within 1-247`},
		{[]string{"scan", "modbus", "--tcp", "h:1", "--units", "5-2"}, `FROM not above TO`},
		{[]string{"scan", "modbus", "--tcp", "h:1", "--registers", "a"}, `--registers a: "a" is not a number`},
		{[]string{"scan", "modbus", "--rtu", "/dev/x", "--parity", "X"}, "--parity must be N, E or O"},
		{[]string{"scan", "modbus", "--tcp", "h:1", "--timeout-ms", "0"}, "--timeout-ms must be 1..60000"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(c.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", c.args, code, stderr.String(), c.want)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"scan", "modbus", "--rtu", "/nonexistent/tty", "--units", "1"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "/nonexistent/tty") {
		t.Errorf("missing port: exit %d, stderr %q", code, stderr.String())
	}
}

// TestScanSkeletonSchemaResolves: the skeleton's yaml-language-server
// line names a schema file that exists on this machine, relative to the
// written file as the examples' lines are (../../schemas/…): written
// inside the clone, it is the repository's schemas/; written to stdout,
// relative to the current directory; elsewhere, the installed schemas.
func TestScanSkeletonSchemaResolves(t *testing.T) {
	bank := modbustest.NewBank(2)
	bank.SetHolding(1, 0, 42)
	srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	// scan returns the skeleton's first line.
	scan := func(t *testing.T, out string) string {
		t.Helper()
		args := []string{"scan", "modbus", "--tcp", srv.Addr, "--units", "1", "--registers", "0-3", "--timeout-ms", "200"}
		if out != "" {
			args = append(args, "--out", out)
		}
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Fatalf("scan exit %d: %s", code, stderr.String())
		}
		skel := stdout.String()
		if out != "" {
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			skel = string(b)
		}
		first, _, _ := strings.Cut(skel, "\n")
		return first
	}
	schemaRef := func(t *testing.T, first string) string {
		t.Helper()
		ref, ok := strings.CutPrefix(first, "# yaml-language-server: $schema=")
		if !ok || strings.Contains(ref, "://") {
			t.Fatalf("the skeleton's first line is %q, want a schema line naming a file on this machine", first)
		}
		return ref
	}
	repoSchema, err := os.ReadFile(filepath.Join("..", "..", "schemas", "physmcp.manifest.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	resolvesTo := func(t *testing.T, base, ref string) {
		t.Helper()
		if filepath.IsAbs(ref) || !strings.HasPrefix(ref, "../") {
			t.Errorf("$schema=%s: want a path relative to the file, like the examples'", ref)
		}
		got, err := os.ReadFile(filepath.Join(base, filepath.FromSlash(ref)))
		if err != nil || !bytes.Equal(got, repoSchema) {
			t.Errorf("$schema=%s from %s does not resolve to the repository's manifest schema: %v", ref, base, err)
		}
	}

	t.Run("in the clone", func(t *testing.T) {
		dir, err := os.MkdirTemp("testdata", "scan-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		out := filepath.Join(dir, "site", "physmcp.manifest.yml")
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		ref := schemaRef(t, scan(t, out))
		if ref != "../../../../../schemas/physmcp.manifest.schema.json" {
			t.Errorf("$schema=%s", ref)
		}
		resolvesTo(t, filepath.Dir(out), ref)
	})
	t.Run("stdout", func(t *testing.T) {
		resolvesTo(t, ".", schemaRef(t, scan(t, "")))
	})
	t.Run("outside a clone", func(t *testing.T) {
		installed := t.TempDir()
		if err := os.WriteFile(filepath.Join(installed, "physmcp.manifest.schema.json"), repoSchema, 0o644); err != nil {
			t.Fatal(err)
		}
		defer func(old string) { installedSchemas = old }(installedSchemas)
		installedSchemas = installed
		ref := schemaRef(t, scan(t, filepath.Join(t.TempDir(), "physmcp.manifest.yml")))
		if got, err := os.ReadFile(ref); err != nil || !bytes.Equal(got, repoSchema) {
			t.Errorf("$schema=%s: want the installed schema (%s): %v", ref, installed, err)
		}
		installedSchemas = filepath.Join(installed, "absent")
		if first := scan(t, filepath.Join(t.TempDir(), "physmcp.manifest.yml")); !strings.HasPrefix(first, "# Editor completion: add the line") {
			t.Errorf("with no schema on this machine the skeleton should say how to add the line: %q", first)
		}
	})
}

// TestScanKeepsAnExistingOut: scan modbus and scan i2c refuse an --out
// that exists before they scan anything (a Modbus sweep takes minutes, and
// the file may be a skeleton already edited), naming --force; with --force
// they go on to the scan.
func TestScanKeepsAnExistingOut(t *testing.T) {
	for _, args := range [][]string{
		{"scan", "modbus", "--tcp", "127.0.0.1:1", "--units", "1", "--timeout-ms", "50"},
		{"scan", "i2c", "--bus", "no-such-bus"},
	} {
		out := filepath.Join(t.TempDir(), "site.yml")
		if err := os.WriteFile(out, []byte("# edited by hand\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		code := run(append(args, "--out", out), &stdout, &stderr)
		if code != 1 || !strings.Contains(stderr.String(), "--out "+out+" exists") || !strings.Contains(stderr.String(), "--force") {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 naming --force", args[:2], code, stderr.String())
		}
		if b, _ := os.ReadFile(out); string(b) != "# edited by hand\n" {
			t.Errorf("%v: --out was changed: %q", args[:2], b)
		}
		stderr.Reset()
		_ = run(append(args, "--out", out, "--force"), &stdout, &stderr)
		if strings.Contains(stderr.String(), "exists") {
			t.Errorf("%v --force: still refused: %s", args[:2], stderr.String())
		}
	}
}
