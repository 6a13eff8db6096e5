// Package bench holds physd's performance benchmarks. These go test
// benchmarks run physd in-process (node + mcpserver + web, wired as cmd/physd
// does) behind httptest on loopback and call it with the same raw 2026-07-28
// HTTP JSON-RPC requests as bench/loadgen. ns/op and allocs/op include the
// HTTP client's share, which is the same for BenchmarkBareEcho, the bare
// go-sdk baseline: compare against it.
//
//	go test ./bench -run '^$' -bench . -benchtime 2s
//	go test ./bench -run '^$' -bench BenchmarkReadCacheHit -cpuprofile /tmp/read.prof
//
// bench/run.sh measures the built binaries (see bench/results.md).
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/bench/internal/bare"
	"github.com/physd/physd/bench/internal/rawmcp"
	_ "github.com/physd/physd/drivers/sim" // the sim bus
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
	"github.com/physd/physd/store"
	"github.com/physd/physd/web"
)

func repoPath(rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", rel)
}

var (
	greenhouse = repoPath("examples/greenhouse/physmcp.manifest.yml")
	manifest50 = repoPath("bench/manifest50.yml")
)

const canDoArgs = `{"intent":{"semantic_tags":["heating"],"action":"increase","location":"zone_a"}}`

// startPhysd serves a node for the manifest over loopback HTTP, with its
// state (ledger, audit) in a temporary directory on disk. It returns the
// /mcp URL.
func startPhysd(tb testing.TB, manifestPath string) string {
	tb.Helper()
	m, err := manifest.Load(manifestPath)
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		tb.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(dir, "audit"))
	if err != nil {
		st.Close()
		tb.Fatal(err)
	}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		al.Close()
		st.Close()
		tb.Fatal(err)
	}
	ts := httptest.NewServer(web.New(mcpserver.New(n, mcpserver.Options{}), web.Options{}).Handler())
	tb.Cleanup(func() {
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = n.Close(ctx)
		al.Close()
		st.Close()
	})
	return ts.URL + "/mcp"
}

func startBare(tb testing.TB) string { return startBareServer(tb, bare.NewServer()) }

func startBareServer(tb testing.TB, s *mcp.Server) string {
	tb.Helper()
	mux := http.NewServeMux()
	mux.Handle("/mcp", bare.Handler(s))
	ts := httptest.NewServer(mux)
	tb.Cleanup(ts.Close)
	return ts.URL + "/mcp"
}

var callID atomic.Int64

func call(tb testing.TB, hc *http.Client, url, tool string, args []byte) json.RawMessage {
	sc, err := rawmcp.Call(context.Background(), hc, url, callID.Add(1), tool, args)
	if err != nil {
		tb.Fatalf("%s: %v", tool, err)
	}
	return sc
}

// benchCalls runs b.N calls on one keep-alive connection (concurrency 1).
func benchCalls(b *testing.B, url, tool string, args func(i int) []byte) {
	hc := rawmcp.NewHTTPClient(1)
	call(b, hc, url, tool, args(-1)) // connect and warm the cache
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		call(b, hc, url, tool, args(i))
	}
}

func fixed(s string) func(int) []byte { return func(int) []byte { return []byte(s) } }

func doArgs(prefix string) func(int) []byte {
	return func(i int) []byte {
		return fmt.Appendf(nil, `{"value":%d,"idempotency_key":"%s-%d"}`, (i+101)%101, prefix, i)
	}
}

// BenchmarkBareEcho is the baseline: a bare go-sdk server, one trivial tool.
func BenchmarkBareEcho(b *testing.B) {
	benchCalls(b, startBare(b), "echo", fixed(`{"text":"hi"}`))
}

// BenchmarkBareEchoRaw is the baseline with echo registered like physd's
// tools (Server.AddTool, raw handler, no SDK schema validation).
func BenchmarkBareEchoRaw(b *testing.B) {
	benchCalls(b, startBareServer(b, bare.NewRawServer()), "echo", fixed(`{"text":"hi"}`))
}

// BenchmarkReadCacheHit is read_ served from the cache (TTL 2 s, the sim
// device has zero latency).
func BenchmarkReadCacheHit(b *testing.B) {
	benchCalls(b, startPhysd(b, greenhouse), "read_temperature_zone_a", fixed(`{}`))
}

// BenchmarkReadCacheHitParallel is the same with GOMAXPROCS×4 concurrent
// keep-alive clients (throughput).
func BenchmarkReadCacheHitParallel(b *testing.B) {
	url := startPhysd(b, greenhouse)
	hc := rawmcp.NewHTTPClient(4 * runtime.GOMAXPROCS(0))
	call(b, hc, url, "read_temperature_zone_a", []byte(`{}`))
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			call(b, hc, url, "read_temperature_zone_a", []byte(`{}`))
		}
	})
}

// BenchmarkBareEchoParallel is the baseline for BenchmarkReadCacheHitParallel.
func BenchmarkBareEchoParallel(b *testing.B) {
	url := startBare(b)
	hc := rawmcp.NewHTTPClient(4 * runtime.GOMAXPROCS(0))
	call(b, hc, url, "echo", []byte(`{"text":"hi"}`))
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			call(b, hc, url, "echo", []byte(`{"text":"hi"}`))
		}
	})
}

// BenchmarkDo is the full do_ path: ledger begin, previous read, write,
// read-back, audit append and ledger completion, each write fsynced, with a
// fresh idempotency key per call.
func BenchmarkDo(b *testing.B) {
	benchCalls(b, startPhysd(b, greenhouse), "do_fan_zone_b", doArgs("bench-"+strconv.FormatInt(time.Now().UnixNano(), 36)))
}

// BenchmarkDoParallel is BenchmarkDo with GOMAXPROCS×4 concurrent clients
// on one capability (its device steps run one at a time).
func BenchmarkDoParallel(b *testing.B) {
	url := startPhysd(b, greenhouse)
	hc := rawmcp.NewHTTPClient(4 * runtime.GOMAXPROCS(0))
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var n atomic.Int64
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			call(b, hc, url, "do_fan_zone_b", []byte(`{"value":`+strconv.FormatInt(i%101, 10)+`,"idempotency_key":"p-`+run+`-`+strconv.FormatInt(i, 10)+`"}`))
		}
	})
}

// BenchmarkCanDo50 is can_do against the 50-capability manifest.
func BenchmarkCanDo50(b *testing.B) {
	benchCalls(b, startPhysd(b, manifest50), "can_do", fixed(canDoArgs))
}

// TestBenchSetup checks, quickly, that every benchmark's call succeeds, so
// go test ./... keeps the benchmarks honest without running them.
func TestBenchSetup(t *testing.T) {
	hc := rawmcp.NewHTTPClient(1)
	outcome := func(sc json.RawMessage) rawmcp.Outcome {
		var o rawmcp.Outcome
		if err := json.Unmarshal(sc, &o); err != nil {
			t.Fatalf("%v: %s", err, sc)
		}
		return o
	}
	if o := outcome(call(t, hc, startBare(t), "echo", []byte(`{"text":"hi"}`))); o.Echo != "hi" {
		t.Errorf("echo: %+v", o)
	}
	if o := outcome(call(t, hc, startBareServer(t, bare.NewRawServer()), "echo", []byte(`{"text":"hi"}`))); o.Echo != "hi" {
		t.Errorf("raw echo: %+v", o)
	}
	u := startPhysd(t, greenhouse)
	if o := outcome(call(t, hc, u, "read_temperature_zone_a", []byte(`{}`))); o.Quality != "good" {
		t.Errorf("read_: %+v", o)
	}
	if o := outcome(call(t, hc, u, "do_fan_zone_b", doArgs("setup")(1))); o.Status != "success" {
		t.Errorf("do_: %+v", o)
	}
	if o := outcome(call(t, hc, startPhysd(t, manifest50), "can_do", []byte(canDoArgs))); o.Feasible == nil || !*o.Feasible {
		t.Errorf("can_do: %+v", o)
	}
}
