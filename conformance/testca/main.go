// Command testca writes a throw-away certificate authority and a server
// certificate for localhost, 127.0.0.1 and ::1 into a directory, for the
// outside-in TLS checks (conformance/run.sh): ca.pem, server.pem and
// server-key.pem. Nothing it makes is fit for production.
//
//	go run ./conformance/testca -dir DIR
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/physd/physd/internal/testpki"
)

func main() {
	dir := flag.String("dir", "", "directory to write ca.pem, server.pem and server-key.pem to (created if missing)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "usage: testca -dir DIR")
		os.Exit(2)
	}
	if err := write(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "testca:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := testpki.NewCA("physd conformance test CA")
	if err != nil {
		return err
	}
	srv, err := ca.Server()
	if err != nil {
		return err
	}
	if _, _, err := srv.WriteFiles(dir, "server"); err != nil {
		return err
	}
	return ca.WriteFile(filepath.Join(dir, "ca.pem"))
}
