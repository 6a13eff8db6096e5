//go:build pprof

package main

// Built with -tags pprof (bench/scale10k.sh with PROFILE=dir), physd
// serves net/http/pprof on $PHYSD_PPROF (host:port) beside its own
// listeners, so the benchmarks can profile the running daemon (go tool
// pprof). Release builds carry none of it.

import (
	"log"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof/ on http.DefaultServeMux
	"os"
)

func init() {
	if addr := os.Getenv("PHYSD_PPROF"); addr != "" {
		go func() { log.Println("pprof:", http.ListenAndServe(addr, nil)) }()
	}
}
