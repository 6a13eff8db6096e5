package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// update rewrites the golden files: go test ./cmd/physd -run Golden -update
var update = flag.Bool("update", false, "rewrite testdata/golden from the current output")

// asPhysd makes the test binary act as the physd binary when started with
// this variable set, so tests can start real physd processes (signals,
// stdio, the commands a client config names) without building one.
const asPhysd = "PHYSD_TEST_AS_PHYSD"

func TestMain(m *testing.M) {
	if os.Getenv(asPhysd) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	flag.Parse()
	os.Exit(m.Run())
}

// physdCommand is a physd process: this test binary in physd mode.
func physdCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), asPhysd+"=1")
	return cmd
}

// runCLI runs the physd command line in process.
func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// logLines reads physd's JSON log from r, sending each decoded line to
// lines until r ends; a line that is not JSON is sent with only "text" set.
func logLines(r io.Reader, lines chan<- map[string]any) {
	defer close(lines)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			m = map[string]any{"text": sc.Text()}
		}
		lines <- m
	}
}

// waitFor returns the first log line whose msg is msg, with every line
// read up to it, or fails when the log ends first.
func waitFor(t *testing.T, lines <-chan map[string]any, msg string) (map[string]any, []map[string]any) {
	t.Helper()
	var seen []map[string]any
	for l := range lines {
		seen = append(seen, l)
		if l["msg"] == msg {
			return l, seen
		}
	}
	t.Fatalf("physd's log ended without %q: %v", msg, seen)
	return nil, nil
}

func testdata(parts ...string) string {
	return filepath.Join(append([]string{"testdata"}, parts...)...)
}

// checkGolden compares got with testdata/golden/name, or rewrites it
// with -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := testdata("golden", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (create it with: go test ./cmd/physd -run %s -update)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("output differs from %s (rewrite with -update if the change is intended)\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func hasJSONLine(s string) bool {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "{") {
			return true
		}
	}
	return false
}
