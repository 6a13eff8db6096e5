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
