// Command baresdk is the benchmark baseline: a bare go-sdk v1.8.0 server
// with one trivial tool ("echo"), served at POST /mcp with the same
// Streamable HTTP options and http.Server settings as physd. Like physd it
// logs {"msg":"listening","addr":...} and {"msg":"ready"} as JSON on stderr.
//
//	baresdk [--http 127.0.0.1:0] [--raw]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/physd/physd/bench/internal/bare"
)

func main() {
	start := time.Now()
	addr := flag.String("http", "127.0.0.1:0", "listen address")
	raw := flag.Bool("raw", false, "register echo like physd does (Server.AddTool, raw handler) instead of the typed mcp.AddTool")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	mux := http.NewServeMux()
	srv := bare.NewServer()
	if *raw {
		srv = bare.NewRawServer()
	}
	mux.Handle("/mcp", bare.Handler(srv))
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"ready": true})
	})
	hs := &http.Server{ // physd's settings (web.Server.Serve)
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Error("listen", "err", err.Error())
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	log.Info("listening", "addr", l.Addr().String(), "mcp", "http://"+l.Addr().String()+"/mcp")
	log.Info("ready", "startup_ms", time.Since(start).Milliseconds())
	select {
	case err := <-errc:
		log.Error("serve", "err", err.Error())
		os.Exit(1)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("shutdown", "err", err.Error())
	}
}
