// Package natscluster runs real nats-server processes for the fleet's
// tests: a hub cluster of one or three servers with JetStream (a domain
// of its own), a leaf node per site whose link to the hub runs through a
// TCP proxy the test controls (cut, stall, latency: the site's WAN), and
// per-site users whose permissions the hub applies to the leaf's
// connection. Each server is configured by a generated file, like an
// operator's, and can be killed and restarted on its ports and store.
//
// The nats-server binary is the module go.mod pins, built once per
// machine from the module cache (go build github.com/nats-io/nats-server/v2):
// no download, and the same server the embedded tests (natstest) run.
package natscluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary is the path of the nats-server binary of go.mod's version,
// built on first use into the temporary directory (kept between runs:
// its name carries the version, so a new pin builds a new one).
func Binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() { binPath, binErr = build() })
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func build() (string, error) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("physd-nats-server-%s-%s-%s", server.VERSION, runtime.GOOS, runtime.GOARCH))
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	// Built beside its final name and renamed: a concurrent test binary
	// (go test runs packages in parallel) never runs a half-written file.
	tmp, err := os.CreateTemp(os.TempDir(), "physd-nats-server-*")
	if err != nil {
		return "", err
	}
	tmp.Close()
	cmd := exec.Command("go", "build", "-o", tmp.Name(), "github.com/nats-io/nats-server/v2")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("building nats-server %s from the module cache: %v\n%s", server.VERSION, err, out)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return path, nil
}
