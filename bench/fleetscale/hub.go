package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/physd/physd/hub"
)

// hubServer is one nats-server process of the hub.
type hubServer struct {
	name                string
	client, http, route int
	dir                 string
	cmd                 *exec.Cmd
	exited              chan struct{}
}

// hubUser is a user in the hub's configuration.
type hubUser struct {
	name, password string
	perms          *hub.Permissions // nil: everything (the operator)
}

// startHub runs servers nats-server processes (1, or 3 in a cluster) with
// JetStream and the users, each from a generated configuration file (JSON,
// which nats-server's configuration format reads), and waits until every
// one is healthy (its JetStream current).
func startHub(bin, dir string, servers int, users []hubUser) ([]*hubServer, error) {
	var hs []*hubServer
	for i := range servers {
		s := &hubServer{name: fmt.Sprintf("hub-%d", i+1), client: freePort(), http: freePort(), route: freePort(), dir: filepath.Join(dir, fmt.Sprintf("hub-%d", i+1))}
		hs = append(hs, s)
	}
	var routes []string
	for _, s := range hs {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", s.route))
	}
	var us []map[string]any
	for _, u := range users {
		e := map[string]any{"user": u.name, "password": u.password}
		if u.perms != nil {
			e["permissions"] = map[string]any{"publish": map[string]any{"allow": u.perms.Publish}, "subscribe": map[string]any{"allow": u.perms.Subscribe}}
		}
		us = append(us, e)
	}
	for _, s := range hs {
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			return hs, err
		}
		conf := map[string]any{"server_name": s.name, "host": "127.0.0.1", "port": s.client, "http": fmt.Sprintf("127.0.0.1:%d", s.http),
			"jetstream":     map[string]any{"store_dir": filepath.Join(s.dir, "store")},
			"authorization": map[string]any{"users": us}}
		if servers > 1 {
			conf["cluster"] = map[string]any{"name": "hub", "host": "127.0.0.1", "port": s.route, "routes": routes}
		}
		// nats-server reads JSON but not its \u escapes: none of < > &.
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		_ = enc.Encode(conf)
		path := filepath.Join(s.dir, "hub.conf")
		if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
			return hs, err
		}
		logf, err := os.Create(filepath.Join(s.dir, "server.log"))
		if err != nil {
			return hs, err
		}
		s.cmd = exec.Command(bin, "-c", path)
		s.cmd.Stdout, s.cmd.Stderr = logf, logf
		if err := s.cmd.Start(); err != nil {
			return hs, err
		}
		s.exited = make(chan struct{})
		go func() { _ = s.cmd.Wait(); logf.Close(); close(s.exited) }()
	}
	for _, s := range hs {
		if err := s.waitHealthy(60 * time.Second); err != nil {
			return hs, err
		}
	}
	return hs, nil
}

func (s *hubServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.client) }

func (s *hubServer) waitHealthy(d time.Duration) error {
	for end := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", s.http))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-s.exited:
			b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
			return fmt.Errorf("%s exited:\n%s", s.name, b)
		default:
		}
		if time.Now().After(end) {
			return fmt.Errorf("%s not healthy after %s: %v", s.name, d, err)
		}
	}
}

func (s *hubServer) stop() { stopProcess(s.cmd, s.exited) }

// stopProcess interrupts a process the bench started and waits until
// exited is closed; after 15 s it kills it.
func stopProcess(cmd *exec.Cmd, exited <-chan struct{}) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

func hubURLs(hs []*hubServer) []string {
	var out []string
	for _, s := range hs {
		out = append(out, s.url())
	}
	return out
}

func joinURLs(hs []*hubServer) string { return strings.Join(hubURLs(hs), ",") }

// freePort is a loopback port free now.
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
