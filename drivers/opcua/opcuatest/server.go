// Package opcuatest runs the node-opcua test server of
// examples/opcua/server for tests: an OPC UA server implementation
// independent of gopcua. Tests skip, saying why, when Node or the npm
// packages are not installed (cd examples/opcua/server && npm ci).
package opcuatest

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options choose the server's security and identity.
type Options struct {
	Secure bool   // Basic256Sha256 Sign and SignAndEncrypt only
	User   string // "name:password": user/password identity required
	// UserCert is a PEM user certificate the server takes as an X.509
	// identity (others are refused).
	UserCert string
	PKI      string // the server's PKI folder (its certificate); "": a temporary one
	// ShiftNamespace registers another namespace before the test
	// server's, which is then ns=2: a reordered namespace table.
	ShiftNamespace bool
	// OperationLimits publishes and enforces MaxNodesPerRead and
	// MaxNodesPerBrowse (0: node-opcua's defaults).
	OperationLimits int
	// Process is ns=1;s=Process's value at start (nil: the script's 50),
	// so a test can tell a value read after a restart from one before.
	Process *float64
	// SessionTimeout caps the session timeout the server grants (ms; 0:
	// node-opcua's), as a PLC that revises a client's request down does.
	SessionTimeout int
	// PublishFault answers every Publish request after the first
	// PublishFaultAfter with a ServiceFault of this status name
	// (BadSubscriptionIdInvalid, BadTooManyPublishRequests).
	PublishFault      string
	PublishFaultAfter int
	// PublishDelay sends every Publish response this late (ms).
	PublishDelay int
	// DropChanges reports each monitored item's first value only: a
	// server whose DataChangeFilter misses every later change.
	DropChanges bool
	// WriteFault answers every Write request with a ServiceFault of this
	// status name (BadUserAccessDenied): the server writes nothing.
	WriteFault string
	// Points adds the folder Scale: Points Double AnalogItems
	// ns=1;s=P00000 … that all move every second, and writable setpoints
	// ns=1;s=SP0 … (the 10 000-point benchmark's server), with limits that
	// take them all as one session's monitored items.
	Points int
	// LogSizes has the server print "request CreateMonitoredItemsRequest
	// N" and "request ReadRequest N" (Output) for each such request.
	LogSizes bool
}

// Server is a running test server.
type Server struct {
	t        testing.TB
	dir      string // examples/opcua/server
	node     string
	port     int
	opts     Options
	Endpoint string

	mu  sync.Mutex
	cmd *exec.Cmd
	out *strings.Builder
}

// Dir finds examples/opcua/server from the working directory upwards, and
// the Node binary its npm install brought; ok false says why not.
func Dir() (dir, node string, why string) {
	wd, _ := os.Getwd()
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			dir = filepath.Join(d, "examples", "opcua", "server")
			break
		}
		if filepath.Dir(d) == d {
			return "", "", "no go.mod above " + wd
		}
	}
	node = filepath.Join(dir, "node_modules", ".bin", "node")
	if _, err := os.Stat(node); err != nil {
		return "", "", "Node 22 from npm is not installed in " + dir + " (run: cd examples/opcua/server && npm ci)"
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "node-opcua")); err != nil {
		return "", "", "node-opcua is not installed in " + dir + " (run: cd examples/opcua/server && npm ci)"
	}
	return dir, node, ""
}

// Start starts a server on a free loopback port, or skips t when Node or
// node-opcua are missing. It is stopped when t ends.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	dir, node, why := Dir()
	if why != "" {
		t.Skip("OPC UA test server unavailable: " + why)
	}
	if o.PKI == "" {
		o.PKI = filepath.Join(t.TempDir(), "pki")
	}
	s := &Server{t: t, dir: dir, node: node, opts: o}
	t.Cleanup(s.Stop)
	// Another test's server may take the port between the check and
	// the listen: then another port.
	for try := 0; ; try++ {
		s.port = freePort(t)
		s.Endpoint = fmt.Sprintf("opc.tcp://127.0.0.1:%d/physd", s.port)
		if !s.start() {
			return s
		}
		if try == 4 {
			t.Fatalf("OPC UA test server: five free ports were taken before it listened:\n%s", s.Output())
		}
	}
}

// freePort is a port nothing listens on, below the kernel's ephemeral
// range: a port the kernel hands out (listen on :0) is also the local
// port of some process's next outgoing connection, and one of those
// took it while a test had the server down for a restart (EADDRINUSE,
// the restart failed). Below the range only another test's server, which
// also checks first, can take it.
func freePort(t testing.TB) int {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				lo = n
			}
		}
	}
	if lo > 12000 {
		for range 100 {
			port := 10000 + rand.IntN(lo-10000)
			if l, err := net.Listen("tcp", fmt.Sprintf(":%d", port)); err == nil {
				_ = l.Close()
				return port
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ServerCertificate is the server's certificate file (PEM).
func (s *Server) ServerCertificate() string {
	return filepath.Join(s.opts.PKI, "own", "certs", "server_certificate.pem")
}

// start starts the server and waits until it is ready. It answers true,
// with the server stopped, when the port was taken (EADDRINUSE): the
// caller chooses whether to wait or take another port. Anything else that
// keeps the server from starting fails the test.
func (s *Server) start() (portTaken bool) {
	s.t.Helper()
	args := []string{"server.js", "--port", fmt.Sprint(s.port), "--pki", s.opts.PKI}
	if s.opts.Secure {
		args = append(args, "--secure")
	}
	if s.opts.User != "" {
		args = append(args, "--user", s.opts.User)
	}
	if s.opts.UserCert != "" {
		args = append(args, "--user-cert", s.opts.UserCert)
	}
	if s.opts.ShiftNamespace {
		args = append(args, "--shift-namespace")
	}
	if s.opts.OperationLimits > 0 {
		args = append(args, "--operation-limits", fmt.Sprint(s.opts.OperationLimits))
	}
	if s.opts.SessionTimeout > 0 {
		args = append(args, "--session-timeout", fmt.Sprint(s.opts.SessionTimeout))
	}
	if s.opts.PublishFault != "" {
		args = append(args, "--publish-fault", fmt.Sprintf("%s:%d", s.opts.PublishFault, s.opts.PublishFaultAfter))
	}
	if s.opts.WriteFault != "" {
		args = append(args, "--write-fault", s.opts.WriteFault)
	}
	if s.opts.DropChanges {
		args = append(args, "--drop-changes")
	}
	if s.opts.PublishDelay > 0 {
		args = append(args, "--publish-delay", fmt.Sprint(s.opts.PublishDelay))
	}
	if s.opts.LogSizes {
		args = append(args, "--log-sizes")
	}
	if s.opts.Points > 0 {
		args = append(args, "--points", fmt.Sprint(s.opts.Points))
	}
	if s.opts.Process != nil {
		args = append(args, "--process", fmt.Sprint(*s.opts.Process))
	}
	cmd := exec.Command(s.node, args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	out := &strings.Builder{}
	cmd.Stderr = &lockedWriter{b: out, mu: &s.mu}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	ready, exited := make(chan string, 1), make(chan struct{})
	go func() {
		defer close(exited) // stdout closed: the server ended
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			out.WriteString(line + "\n")
			s.mu.Unlock()
			if strings.HasPrefix(line, "ready ") {
				select {
				case ready <- line:
				default:
				}
			}
		}
	}()
	s.mu.Lock()
	s.cmd, s.out = cmd, out
	s.mu.Unlock()
	select {
	case <-ready:
		return false
	case <-exited:
		s.Stop()
		if strings.Contains(s.Output(), "EADDRINUSE") {
			return true
		}
		s.t.Fatalf("OPC UA test server ended before it was ready:\n%s", s.Output())
	case <-time.After(90 * time.Second):
		s.Stop()
		s.t.Fatalf("OPC UA test server did not start in 90 s:\n%s", s.Output())
	}
	return false
}

// Output is what the server printed so far.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}

// Stop ends the server (SIGTERM, then SIGKILL after 5 s).
func (s *Server) Stop() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// Restart stops the server and starts it again on the same port with the
// same PKI: every value is back at its initial one, every session gone.
func (s *Server) Restart() { s.RestartWith(nil) }

// RestartWith is Restart with the options change makes (nil: none).
func (s *Server) RestartWith(change func(*Options)) {
	s.t.Helper()
	s.Stop()
	if change != nil {
		change(&s.opts)
	}
	// The endpoint must stay: a port still held (by a connection of the
	// old server's closing, or another test's server checking it) is
	// waited for, up to 30 s.
	for deadline := time.Now().Add(30 * time.Second); s.start(); {
		if time.Now().After(deadline) {
			s.t.Fatalf("OPC UA test server could not listen on its port %d again for 30 s:\n%s", s.port, s.Output())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// WaitPort waits until nothing listens on the server's port any more.
func (s *Server) WaitPort(ctx context.Context) {
	for ctx.Err() == nil {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.port), 100*time.Millisecond)
		if err != nil {
			return
		}
		_ = c.Close()
		time.Sleep(50 * time.Millisecond)
	}
}

type lockedWriter struct {
	b  *strings.Builder
	mu *sync.Mutex
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
