package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/physd/physd/drivers/opcua/opcuatest"
)

// TestScanOPCUAGoldenErrors pins what an operator reads for each bad
// `physd scan opcua` command line: one line per problem, naming the flag
// and the fix in flags, before anything is sent (the unreachable endpoint
// aside: nothing listens on port 1).
func TestScanOPCUAGoldenErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"scan_opcua_no_endpoint", []string{"scan", "opcua", "--depth", "3"}, 2},
		{"scan_opcua_unknown_flag", []string{"scan", "opcua", "opc.tcp://127.0.0.1:4840", "--depht", "3"}, 2},
		{"scan_opcua_bad_flags", []string{"scan", "opcua", "http://plc:4840", "--security-mode", "Sign", "--depth", "0", "--username", "op", "--max-nodes", "-1"}, 2},
		{"scan_opcua_server_sha256", []string{"scan", "opcua", "opc.tcp://127.0.0.1:4840", "--server-sha256", "12:ab"}, 2},
		{"scan_opcua_secure_files", []string{"scan", "opcua", "opc.tcp://127.0.0.1:4840", "--security-policy", "Basic256Sha256", "--certificate", "testdata/errors/missing.pem",
			"--private-key", "testdata/errors/missing.key", "--server-certificate", "testdata/errors/missing-server.pem"}, 2},
		{"scan_opcua_pin_twice", []string{"scan", "opcua", "opc.tcp://127.0.0.1:4840", "--security-policy", "Basic256Sha256", "--server-certificate", "a.pem", "--server-trust", "ca1.pem,ca2.pem"}, 2},
		{"scan_opcua_two_endpoints", []string{"scan", "opcua", "opc.tcp://127.0.0.1:4840", "--timeout", "5s", "opc.tcp://127.0.0.1:4841"}, 2},
		{"scan_opcua_bus_name", []string{"scan", "opcua", "opc.tcp://127.0.0.1:4840", "--bus", "Line 1"}, 2},
		{"scan_opcua_unreachable", []string{"scan", "opcua", "opc.tcp://127.0.0.1:1/plc", "--connect-timeout-ms", "500"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			checkGolden(t, tc.name+".txt", fmt.Sprintf("$ physd %s\nexit %d\n--- stdout\n%s--- stderr\n%s", strings.Join(tc.args, " "), code, stdout, stderr))
		})
	}
}

// TestScanOPCUA: the command scans node-opcua into --out, the skeleton
// validates, an existing --out is kept unless --force, and the endpoint
// may come among the flags.
func TestScanOPCUA(t *testing.T) {
	t.Parallel() // its own server on a free port
	srv := opcuatest.Start(t, opcuatest.Options{})
	dir := t.TempDir()
	out := filepath.Join(dir, "plant.yml")
	code, stdout, stderr := runCLI("scan", "opcua", srv.Endpoint, "--out", out, "--bus", "line1", "--device-id", "gw_line1")
	if code != 0 || stdout != "" || !strings.Contains(stderr, "capabilities in the skeleton") || !strings.Contains(stderr, "stopped at depth 6") {
		t.Fatalf("scan: exit %d\n%s%s", code, stdout, stderr)
	}
	skel, _ := os.ReadFile(out)
	for _, part := range []string{"  line1:\n    type: opcua\n    endpoint: \"" + srv.Endpoint + "\"", "binding: {type: opcua, bus: line1, node: \"nsu=urn:physd:opcua-test-server;s=Setpoint\", ua_type: Double}",
		"  id: gw_line1   # DECIDE"} {
		if !strings.Contains(string(skel), part) {
			t.Errorf("the skeleton lacks %q", part)
		}
	}
	if code, stdout, stderr := runCLI("validate", out); code != 0 || !strings.Contains(stdout, "ok (device gw_line1") {
		t.Fatalf("validate: exit %d\n%s%s", code, stdout, stderr)
	}

	if err := os.WriteFile(out, []byte("edited by hand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCLI("scan", "opcua", "--depth", "2", srv.Endpoint, "--out", out)
	if kept, _ := os.ReadFile(out); code != 1 || !strings.Contains(stderr, "--out "+out+" exists; fix: give another file, or --force") || string(kept) != "edited by hand\n" {
		t.Fatalf("an existing --out: exit %d, %q\n%s", code, kept, stderr)
	}
	code, _, stderr = runCLI("scan", "opcua", "--depth", "2", srv.Endpoint, "--out", out, "--force")
	if replaced, _ := os.ReadFile(out); code != 0 || !strings.Contains(string(replaced), "# Manifest skeleton written by physd scan opcua") {
		t.Fatalf("--force: exit %d\n%s", code, stderr)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestScanOPCUASecure: a secured server's certificate is shown until it is
// pinned, in flags; --server-sha256 saves it beside the skeleton and pins
// it there; a mode the server does not offer names the ones it does.
func TestScanOPCUASecure(t *testing.T) {
	t.Parallel() // its own server on a free port
	srv := opcuatest.Start(t, opcuatest.Options{Secure: true})
	pemBytes, err := os.ReadFile(srv.ServerCertificate())
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(pemBytes)
	sum := sha256.Sum256(blk.Bytes)
	fp := hex.EncodeToString(sum[:])
	dir := t.TempDir()
	out := filepath.Join(dir, "plant.yml")

	code, _, stderr := runCLI("scan", "opcua", srv.Endpoint, "--out", out)
	if code != 1 || !strings.Contains(stderr, "physd scan opcua: --security-policy: "+srv.Endpoint+" offers no endpoint with --security-policy None and --security-mode None; it offers Basic256Sha256/Sign, Aes128_Sha256_RsaOaep/Sign, Aes256_Sha256_RsaPss/Sign, Basic256Sha256/SignAndEncrypt, Aes128_Sha256_RsaOaep/SignAndEncrypt, Aes256_Sha256_RsaPss/SignAndEncrypt; fix: use what the server offers, e.g. --security-policy Basic256Sha256 with --security-mode SignAndEncrypt") {
		t.Errorf("security None: exit %d\n%s", code, stderr)
	}
	code, _, stderr = runCLI("scan", "opcua", srv.Endpoint, "--security-policy", "Basic256Sha256", "--out", out)
	if code != 1 || !strings.Contains(stderr, "physd scan opcua: --server-certificate: "+srv.Endpoint+" presents a certificate physd has not been told to trust (sha256 "+fp) ||
		!strings.Contains(stderr, "pin it: --server-sha256 "+fp+" (the scan saves the certificate and pins it)") || fileExists(out) {
		t.Fatalf("no pin: exit %d\n%s", code, stderr)
	}
	code, _, stderr = runCLI("scan", "opcua", srv.Endpoint, "--security-policy", "Basic256Sha256", "--security-mode", "Sign", "--server-sha256", fp, "--out", out, "--depth", "2")
	if code != 0 {
		t.Fatalf("--server-sha256: exit %d\n%s", code, stderr)
	}
	saved, _ := os.ReadFile(filepath.Join(dir, "plc.server.pem"))
	if sblk, _ := pem.Decode(saved); sblk == nil || string(sblk.Bytes) != string(blk.Bytes) {
		t.Fatalf("plc.server.pem is not the server's certificate:\n%s", saved)
	}
	skel, _ := os.ReadFile(out)
	if !strings.Contains(string(skel), "    security_policy: \"Basic256Sha256\"\n    security_mode: \"Sign\"\n    server_certificate: \"plc.server.pem\"   # pinned: sha256 "+fp) {
		t.Errorf("the skeleton's bus:\n%s", skel)
	}
	if code, stdout, stderr := runCLI("validate", out); code != 0 {
		t.Fatalf("validate: exit %d\n%s%s", code, stdout, stderr)
	}
	// A saved certificate is not replaced by another without --force.
	if err := os.WriteFile(filepath.Join(dir, "plc.server.pem"), []byte("another\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCLI("scan", "opcua", srv.Endpoint, "--security-policy", "Basic256Sha256", "--server-sha256", fp, "--out", filepath.Join(dir, "other.yml"), "--depth", "2")
	if code != 1 || !strings.Contains(stderr, "plc.server.pem exists and holds another certificate; fix: move it away, or --force to replace it") {
		t.Errorf("a saved certificate in the way: exit %d\n%s", code, stderr)
	}
}

// TestFlagTextKeepsValues: a key's value becomes the flag's argument,
// whatever its first letter (a SHA-256 may start with a–f); a description
// after the key keeps its colon.
func TestFlagTextKeepsValues(t *testing.T) {
	for in, want := range map[string]string{
		"pin it: server_sha256: ee08db9f (the scan saves it)":  "pin it: --server-sha256 ee08db9f (the scan saves it)",
		"pin it: server_sha256: 0e08db9f (the scan saves it)":  "pin it: --server-sha256 0e08db9f (the scan saves it)",
		"or server_certificate: the server's certificate file": "or --server-certificate: the server's certificate file",
		"add security_policy: Basic256Sha256":                  "add --security-policy Basic256Sha256",
		"private_key: open k.pem: no such file":                "--private-key: open k.pem: no such file",
	} {
		if got := flagText(in); got != want {
			t.Errorf("flagText(%q) = %q, want %q", in, got, want)
		}
	}
}
