package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/goburrow/serial"
	"github.com/physd/physd/daemon"
	"github.com/physd/physd/drivers/i2c"
	"github.com/physd/physd/drivers/modbus"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/schemas"
)

const scanUsage = `usage: physd scan modbus (--tcp HOST:PORT | --rtu DEVICE [--baud N --parity E --stop-bits 1])
                         [--units 1-247] [--timeout-ms 500] [--silence-ms 100] [--registers 0-255]
                         [--chunk 16] [--max-time 10m] [--out FILE [--force]] [--bus NAME] [--device-id ID]
       physd scan i2c [--bus 1] [--out FILE [--force]]
       physd scan opcua ENDPOINT [--security-policy P] [--root NODE] [--depth 6] [--out FILE]   (physd scan opcua -h: every flag)`

// cmdScan is `physd scan modbus`: find the units on a Modbus endpoint and
// write a manifest skeleton. It only ever sends read requests. `scan i2c`
// and `scan opcua` are their own functions.
func cmdScan(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "i2c" {
		return cmdScanI2C(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "opcua" {
		return cmdScanOPCUA(args[1:], stdout, stderr)
	}
	if len(args) == 0 || args[0] != "modbus" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(stdout, scanUsage)
			return 0
		}
		fmt.Fprintln(stderr, "physd scan: name the bus kind: physd scan modbus ..., physd scan i2c ... or physd scan opcua ENDPOINT ...")
		fmt.Fprintln(stderr, scanUsage)
		return 2
	}
	fs := flag.NewFlagSet("physd scan modbus", flag.ContinueOnError)
	tcp := fs.String("tcp", "", "Modbus TCP endpoint host:port (port 502 if left out)")
	rtu := fs.String("rtu", "", "Modbus RTU serial port, e.g. /dev/ttyUSB0")
	baud := fs.Int("baud", 19200, "RTU baud rate")
	parity := fs.String("parity", "E", "RTU parity: N, E or O")
	stopBits := fs.Int("stop-bits", 1, "RTU stop bits: 1 or 2")
	units := fs.String("units", "1-247", "unit ids to try: 1-247, or a list like 1,2,10-20")
	timeoutMS := fs.Int("timeout-ms", 500, "wait for one reply, in ms (slow RS-485 devices may need 1000)")
	silenceMS := fs.Int("silence-ms", 100, "RTU: quiet line required after a timeout, in ms")
	regs := fs.String("registers", "0-255", "0-based addresses probed in every table, FROM-TO")
	chunk := fs.Int("chunk", 16, "registers per probe read (bits: 4x); 1 finds every address, slowly")
	maxTime := fs.Duration("max-time", 10*time.Minute, "bound on the whole scan; units not reached are listed in the skeleton")
	out := fs.String("out", "", "write the skeleton to this file instead of stdout")
	force := fs.Bool("force", false, "overwrite --out if it exists")
	busName := fs.String("bus", "modbus1", "bus name in the skeleton")
	deviceID := fs.String("device-id", "gw_modbus_001", "device.id in the skeleton")
	if code, ok := parseFlags(fs, args[1:], stdout, stderr); !ok {
		return code
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "physd scan modbus: "+format+"\n%s\n", append(a, scanUsage)...)
		return 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q", fs.Arg(0))
	}
	if (*tcp == "") == (*rtu == "") {
		return bad("give exactly one of --tcp HOST:PORT or --rtu DEVICE")
	}
	if refuseExistingOut("physd scan modbus", *out, *force, stderr) {
		return 1
	}
	ids, err := parseUnits(*units, *rtu != "")
	if err != nil {
		return bad("--units %s: %v", *units, err)
	}
	from, to, err := parseRange(*regs)
	if err != nil {
		return bad("--registers %s: %v", *regs, err)
	}
	if *timeoutMS < 1 || *timeoutMS > 60_000 {
		return bad("--timeout-ms must be 1..60000, got %d", *timeoutMS)
	}
	if *silenceMS < 1 || *silenceMS > 60_000 {
		return bad("--silence-ms must be 1..60000, got %d", *silenceMS)
	}
	if *chunk < 1 || *chunk > 125 {
		return bad("--chunk must be 1..125, got %d", *chunk)
	}
	if *maxTime <= 0 {
		return bad("--max-time must be positive, e.g. 10m")
	}
	o := modbus.ScanOptions{
		Units: ids, Timeout: time.Duration(*timeoutMS) * time.Millisecond, Silence: time.Duration(*silenceMS) * time.Millisecond,
		MaxTime: *maxTime, From: from, To: to, Chunk: *chunk, Progress: stderr,
	}
	if *tcp != "" {
		o.TCP = strings.TrimPrefix(*tcp, "tcp://")
		if !strings.Contains(strings.TrimPrefix(o.TCP, "["), ":") || strings.HasSuffix(o.TCP, "]") {
			o.TCP += ":502"
		}
	} else {
		p := strings.ToUpper(*parity)
		if p != "N" && p != "E" && p != "O" {
			return bad("--parity must be N, E or O, got %q", *parity)
		}
		if *stopBits != 1 && *stopBits != 2 {
			return bad("--stop-bits must be 1 or 2, got %d", *stopBits)
		}
		o.Serial = serial.Config{Address: *rtu, BaudRate: *baud, DataBits: 8, Parity: p, StopBits: *stopBits}
	}
	// Worst case: every unit absent costs its timeout and, on RTU, a quiet line.
	per := o.Timeout
	if o.TCP == "" {
		per += o.Silence
	}
	fmt.Fprintf(stderr, "physd scan: %d unit(s), at most %v each when absent (%v in all), bounded by --max-time %v; read requests only\n",
		len(ids), per, time.Duration(len(ids))*per, *maxTime)

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	rep, err := modbus.Scan(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "physd scan modbus: %v\n", err)
		return 1
	}
	skel := rep.Skeleton(modbus.SkeletonOptions{
		DeviceID: *deviceID, Bus: *busName, At: time.Now(),
		Command: "physd scan modbus " + strings.Join(args[1:], " "),
	})
	fmt.Fprintf(stderr, "physd scan: %d of %d unit(s) answered (%d requests, %.1f s)\n", len(rep.Units), rep.Tried, rep.Requests, rep.Elapsed.Seconds())
	if len(rep.Skipped) > 0 {
		fmt.Fprintf(stderr, "physd scan: --max-time reached; %d unit(s) not scanned (listed in the skeleton)\n", len(rep.Skipped))
	}
	return writeSkeleton("physd scan modbus", skel, *out, len(rep.Units) > 0,
		"no unit answered: check wiring, baud and parity, the unit ids (--units) and --timeout-ms", stdout, stderr)
}

// writeSkeleton writes a scan's manifest skeleton to out (or stdout) and
// checks it exactly as validate does. It must validate; if it does not,
// that is physd's bug, and the file is still written so the user can see
// why. found false (nothing answered or recognised) exits 1 with miss.
func writeSkeleton(cmd string, skel []byte, out string, found bool, miss string, stdout, stderr io.Writer) int {
	name := out
	if name == "" {
		name = "<skeleton>"
	}
	skel = append([]byte(schemaLine(out)+"\n"), skel...)
	m, verr := manifest.Parse(name, skel)
	if verr == nil {
		verr = daemon.CheckBindings(m)
	}
	if out != "" {
		if err := writeFileAtomic(out, skel, 0o644); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
			return 1
		}
		fmt.Fprintf(stderr, "physd scan: wrote %s; edit the DECIDE lines, then: physd validate %s\n", out, out)
	} else {
		_, _ = stdout.Write(skel)
	}
	if !found {
		fmt.Fprintln(stderr, "physd scan: "+miss)
		return 1
	}
	if verr != nil {
		fmt.Fprintf(stderr, "physd scan: the skeleton does not validate (a physd bug, please report): %v\n", verr)
		return 1
	}
	return 0
}

// writeFileAtomic writes data to path through a temporary file in the
// same folder and a rename, so the file is never seen half written.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, perm)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// installedSchemas is where the Debian package puts the JSON Schemas.
var installedSchemas = "/usr/share/physd/schemas"

// schemaLine is the editor's schema line for a skeleton written to out
// (stdout: the current directory, where a redirect puts it). It points at
// a schema on this machine, as the examples do, so completion works
// offline: the schemas/ of the physd clone the file is in (relative to
// the file, like the examples' ../../schemas/…), else the installed ones;
// with neither, a comment says how to add the line.
func schemaLine(out string) string {
	dir, err := filepath.Abs(filepath.Dir(out))
	if out == "" {
		dir, err = os.Getwd()
	}
	if err == nil {
		for d := dir; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "schemas", schemas.ManifestFile)); err == nil {
				rel, _ := filepath.Rel(dir, filepath.Join(d, "schemas", schemas.ManifestFile))
				return "# yaml-language-server: $schema=" + filepath.ToSlash(rel)
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if abs := filepath.Join(installedSchemas, schemas.ManifestFile); fileExists(abs) {
		return "# yaml-language-server: $schema=" + filepath.ToSlash(abs)
	}
	return "# Editor completion: add the line  # yaml-language-server: $schema=<path to physd's schemas/" + schemas.ManifestFile +
		">  (docs/manifest.md, Editor completion)"
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// parseUnits parses "1-247" or "1,2,10-20". RTU unit ids are 1..247
// (0 is broadcast, which never answers); TCP takes 0..255.
func parseUnits(s string, rtu bool) ([]byte, error) {
	lo, hi := 0, 255
	if rtu {
		lo, hi = 1, 247
	}
	var ids []byte
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		a, b, err := parseSpan(strings.TrimSpace(part), lo, hi)
		if err != nil {
			return nil, err
		}
		for i := a; i <= b; i++ {
			if !seen[i] {
				seen[i] = true
				ids = append(ids, byte(i))
			}
		}
	}
	return ids, nil
}

func parseRange(s string) (uint16, uint16, error) {
	a, b, err := parseSpan(strings.TrimSpace(s), 0, 65535)
	return uint16(a), uint16(b), err
}

func parseSpan(s string, lo, hi int) (int, int, error) {
	as, bs, isRange := strings.Cut(s, "-")
	a, err := strconv.Atoi(strings.TrimSpace(as))
	if err != nil {
		return 0, 0, fmt.Errorf("%q is not a number or FROM-TO range", s)
	}
	b := a
	if isRange {
		if b, err = strconv.Atoi(strings.TrimSpace(bs)); err != nil {
			return 0, 0, fmt.Errorf("%q is not a FROM-TO range", s)
		}
	}
	if a < lo || b > hi || a > b {
		return 0, 0, fmt.Errorf("%q must lie within %d-%d, FROM not above TO", s, lo, hi)
	}
	return a, b, nil
}

// cmdScanI2C is `physd scan i2c`: sweep an I²C bus, recognise the parts
// physd has profiles for by their id registers, and write a skeleton.
func cmdScanI2C(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("physd scan i2c", flag.ContinueOnError)
	bus := fs.String("bus", "1", `the I²C bus: "1", "/dev/i2c-1" or a periph bus name`)
	out := fs.String("out", "", "write the skeleton to this file instead of stdout")
	force := fs.Bool("force", false, "overwrite --out if it exists")
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "physd scan i2c: unexpected argument %q\n%s\n", fs.Arg(0), scanUsage)
		return 2
	}
	if refuseExistingOut("physd scan i2c", *out, *force, stderr) {
		return 1
	}
	bc, resolved, err := i2c.OpenForScan(*bus)
	if err != nil {
		fmt.Fprintf(stderr, "physd scan i2c: %v\n", err)
		return 1
	}
	found := i2c.Sweep(bc)
	_ = bc.Close()
	known := 0
	for _, f := range found {
		what := "not recognised"
		if f.Profile != "" {
			what, known = f.Profile+" ("+f.How+")", known+1
		}
		fmt.Fprintf(stderr, "0x%02X answers: %s\n", f.Addr, what)
	}
	skel := i2c.I2CSkeleton(*bus, resolved, "physd scan i2c "+strings.Join(args, " "), found)
	fmt.Fprintf(stderr, "physd scan: %d address(es) answered, %d recognised\n", len(found), known)
	return writeSkeleton("physd scan i2c", skel, *out, known > 0,
		"no part physd knows was found: check wiring and pull-ups; bind other addresses by hand", stdout, stderr)
}

// refuseExistingOut reports (and says so) when --out names a file that
// exists and --force was not given: a skeleton the integrator has edited
// is not replaced by a new scan. It is checked before the scan, which may
// take minutes.
func refuseExistingOut(cmd, out string, force bool, stderr io.Writer) bool {
	if out == "" || force || !fileExists(out) {
		return false
	}
	fmt.Fprintf(stderr, "%s: --out %s exists; fix: give another file, or --force to replace it (edits made to it are lost)\n", cmd, out)
	return true
}
