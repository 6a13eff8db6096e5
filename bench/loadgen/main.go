// Command loadgen drives an MCP server with raw HTTP JSON-RPC tools/call
// requests in the 2026-07-28 form (Mcp-Method/Mcp-Name headers, per-request
// _meta), over keep-alive connections, and reports throughput and latency.
//
//	loadgen [load flags]                  one measurement, e.g.
//	loadgen -url http://127.0.0.1:PORT/mcp -kind read -tool read_temperature_zone_a -c 8 -d 4s
//	loadgen startup -n 12 -- /tmp/physd run --manifest M --http 127.0.0.1:0
//	loadgen report -in raw.jsonl -md results.md    the results table
//
// Every non-200 answer, JSON-RPC error or isError result counts as an
// error; so does a read_ whose quality is not good, a do_ whose status is
// not success and an echo that does not echo. With -json the result is one
// JSON line on stdout (extra -tag k=v pairs are copied into it).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/physd/physd/bench/internal/rawmcp"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "startup":
			os.Exit(startup(os.Args[2:]))
		case "report":
			os.Exit(report(os.Args[2:]))
		}
	}
	os.Exit(load(os.Args[1:]))
}

type tags map[string]string

func (t tags) String() string { return fmt.Sprint(map[string]string(t)) }
func (t tags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("want k=v, got %q", s)
	}
	t[k] = v
	return nil
}

// Record is one measurement (one JSON line).
type Record struct {
	Tags        map[string]string `json:"tags,omitempty"`
	Kind        string            `json:"kind"`
	Tool        string            `json:"tool"`
	Concurrency int               `json:"c"`
	Calls       int               `json:"calls"`
	Errors      int               `json:"errors"`
	FirstError  string            `json:"first_error,omitempty"`
	Seconds     float64           `json:"seconds"`
	RPS         float64           `json:"rps"`
	P50us       float64           `json:"p50_us"`
	P90us       float64           `json:"p90_us"`
	P99us       float64           `json:"p99_us"`
	MaxUS       float64           `json:"max_us"`
	MeanUS      float64           `json:"mean_us"`
	// SrvCPUus is the server process's CPU time (user+system, from
	// /proc/PID/stat) per call, when -pid is given.
	SrvCPUus float64 `json:"srv_cpu_us_per_call,omitempty"`
	// CliCPUus is this load generator's own CPU per call.
	CliCPUus float64 `json:"cli_cpu_us_per_call"`
	Uncached int     `json:"uncached,omitempty"` // read_: answers with cached:false
}

func load(args []string) int {
	fs := flag.NewFlagSet("loadgen", flag.ExitOnError)
	url := fs.String("url", "", "the MCP endpoint, e.g. http://127.0.0.1:8080/mcp")
	kind := fs.String("kind", "read", "read, do, cando or echo: sets the default arguments and the success check")
	tool := fs.String("tool", "", "tool name (default per kind: read_temperature_zone_a, do_fan_zone_b, can_do, echo)")
	argsJSON := fs.String("args", "", "arguments JSON object (default per kind; do_ always gets a unique idempotency_key and a value 0..100)")
	conc := fs.Int("c", 1, "concurrent workers, one keep-alive connection each")
	dur := fs.Duration("d", 3*time.Second, "measured duration")
	count := fs.Int("n", 0, "measured call count (overrides -d)")
	warm := fs.Duration("warmup", 500*time.Millisecond, "unmeasured warm-up before measuring")
	pid := fs.Int("pid", 0, "server PID, to report its CPU time per call")
	asJSON := fs.Bool("json", false, "print the result as one JSON line")
	tg := tags{}
	fs.Var(tg, "tag", "k=v copied into the JSON record (repeatable)")
	fs.Parse(args)
	if *url == "" {
		fmt.Fprintln(os.Stderr, "loadgen: -url is required")
		return 2
	}
	defTool := map[string]string{"read": "read_temperature_zone_a", "do": "do_fan_zone_b", "cando": "can_do", "echo": "echo"}
	defArgs := map[string]string{
		"read":  `{}`,
		"cando": `{"intent":{"semantic_tags":["heating"],"action":"increase","location":"zone_a"}}`,
		"echo":  `{"text":"hi"}`,
	}
	if _, ok := defTool[*kind]; !ok {
		fmt.Fprintf(os.Stderr, "loadgen: unknown -kind %q\n", *kind)
		return 2
	}
	if *tool == "" {
		*tool = defTool[*kind]
	}
	if *argsJSON == "" {
		*argsJSON = defArgs[*kind]
	}
	var base map[string]any
	if *kind != "do" || *argsJSON != "" {
		if err := json.Unmarshal([]byte(*argsJSON), &base); err != nil && *kind != "do" {
			fmt.Fprintf(os.Stderr, "loadgen: -args: %v\n", err)
			return 2
		}
	}
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	fixed := []byte(*argsJSON)
	mkArgs := func(worker, i int) []byte {
		if *kind != "do" {
			return fixed
		}
		// A fresh idempotency key per call; values sweep 0..100.
		b := make([]byte, 0, 96)
		b = append(b, `{"value":`...)
		b = strconv.AppendInt(b, int64((worker*7+i)%101), 10)
		b = append(b, `,"idempotency_key":"bench-`...)
		b = append(b, runID...)
		b = append(b, '-')
		b = strconv.AppendInt(b, int64(worker), 10)
		b = append(b, '-')
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `"}`...)
		return b
	}
	check := func(sc json.RawMessage) (uncached bool, err error) {
		var o rawmcp.Outcome
		if err := json.Unmarshal(sc, &o); err != nil {
			return false, fmt.Errorf("structuredContent: %v", err)
		}
		switch *kind {
		case "read":
			if o.Quality != "good" {
				return false, fmt.Errorf("quality %q: %.200s", o.Quality, sc)
			}
			return o.Cached != nil && !*o.Cached, nil
		case "do":
			if o.Status != "success" {
				return false, fmt.Errorf("status %q: %.300s", o.Status, sc)
			}
		case "cando":
			if o.Feasible == nil {
				return false, fmt.Errorf("no feasible field: %.200s", sc)
			}
		case "echo":
			if o.Echo != base["text"] {
				return false, fmt.Errorf("echo %q: %.200s", o.Echo, sc)
			}
		}
		return false, nil
	}

	hc := rawmcp.NewHTTPClient(*conc)
	ctx := context.Background()
	var id atomic.Int64
	var seq atomic.Int64 // call numbers for the idempotency keys (also across warm-up)
	type workerResult struct {
		lat      []time.Duration
		errs     int
		first    string
		uncached int
	}
	run := func(deadline time.Time, quota int, measure bool) ([]workerResult, time.Duration) {
		var left atomic.Int64
		left.Store(int64(quota))
		res := make([]workerResult, *conc)
		var wg sync.WaitGroup
		t0 := time.Now()
		for w := range *conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := &res[w]
				if measure {
					r.lat = make([]time.Duration, 0, 4096)
				}
				for {
					if quota > 0 {
						if left.Add(-1) < 0 {
							return
						}
					} else if !time.Now().Before(deadline) {
						return
					}
					i := int(seq.Add(1))
					a := mkArgs(w, i)
					start := time.Now()
					sc, err := rawmcp.Call(ctx, hc, *url, id.Add(1), *tool, a)
					el := time.Since(start)
					var unc bool
					if err == nil {
						unc, err = check(sc)
					}
					if !measure {
						if err != nil {
							r.errs++
							if r.first == "" {
								r.first = err.Error()
							}
						}
						continue
					}
					r.lat = append(r.lat, el)
					if err != nil {
						r.errs++
						if r.first == "" {
							r.first = err.Error()
						}
					}
					if unc {
						r.uncached++
					}
				}
			}()
		}
		wg.Wait()
		return res, time.Since(t0)
	}
	if *warm > 0 {
		wr, _ := run(time.Now().Add(*warm), 0, false)
		for _, r := range wr {
			if r.errs > 0 {
				fmt.Fprintf(os.Stderr, "loadgen: warm-up error: %s\n", r.first)
				break
			}
		}
	}
	srv0 := procCPU(*pid)
	cli0 := selfCPU()
	res, elapsed := run(time.Now().Add(*dur), *count, true)
	srv1 := procCPU(*pid)
	cli1 := selfCPU()

	rec := Record{Tags: tg, Kind: *kind, Tool: *tool, Concurrency: *conc, Seconds: elapsed.Seconds()}
	var all []time.Duration
	for _, r := range res {
		all = append(all, r.lat...)
		rec.Errors += r.errs
		rec.Uncached += r.uncached
		if rec.FirstError == "" {
			rec.FirstError = r.first
		}
	}
	rec.Calls = len(all)
	if rec.Calls > 0 {
		slices.Sort(all)
		pct := func(p float64) float64 {
			i := int(math.Ceil(p*float64(len(all)))) - 1
			return float64(all[max(i, 0)].Nanoseconds()) / 1e3
		}
		var sum time.Duration
		for _, d := range all {
			sum += d
		}
		rec.RPS = float64(rec.Calls) / elapsed.Seconds()
		rec.P50us, rec.P90us, rec.P99us = pct(.50), pct(.90), pct(.99)
		rec.MaxUS = float64(all[len(all)-1].Nanoseconds()) / 1e3
		rec.MeanUS = float64(sum.Nanoseconds()) / 1e3 / float64(rec.Calls)
		if *pid > 0 && srv0 >= 0 && srv1 >= 0 {
			rec.SrvCPUus = float64(srv1-srv0) / float64(rec.Calls)
		}
		rec.CliCPUus = float64(cli1-cli0) / float64(rec.Calls)
	}
	if *asJSON {
		b, _ := json.Marshal(rec)
		fmt.Println(string(b))
	} else {
		fmt.Printf("%s c=%d: %d calls in %.2fs = %.0f calls/s; p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, max %.0f µs; errors %d",
			rec.Tool, rec.Concurrency, rec.Calls, rec.Seconds, rec.RPS, rec.P50us, rec.P90us, rec.P99us, rec.MaxUS, rec.Errors)
		if rec.SrvCPUus > 0 {
			fmt.Printf("; server %.0f CPU-µs/call", rec.SrvCPUus)
		}
		fmt.Printf("; loadgen %.0f CPU-µs/call\n", rec.CliCPUus)
	}
	if rec.Errors > 0 {
		fmt.Fprintf(os.Stderr, "loadgen: %d errors; first: %s\n", rec.Errors, rec.FirstError)
		return 1
	}
	if rec.Calls == 0 {
		fmt.Fprintln(os.Stderr, "loadgen: no calls completed")
		return 1
	}
	return 0
}

// procCPU returns a process's user+system CPU time in µs (all threads),
// or -1.
func procCPU(pid int) int64 {
	if pid <= 0 {
		return -1
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// Fields after the ")" closing comm: state is field 3; utime, stime are 14, 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return -1
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const clkTck = 100 // USER_HZ on Linux
	return (ut + st) * 1e6 / clkTck
}

func selfCPU() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano()/1e3 + ru.Stime.Nano()/1e3
}

// startup measures start-to-ready: wall time from exec to the first 200
// from GET /readyz (the address comes from the "listening" log line), and
// the startup_ms field of the "ready" log line. Each start gets a fresh
// --state directory under -state-root.
func startup(args []string) int {
	fs := flag.NewFlagSet("loadgen startup", flag.ExitOnError)
	n := fs.Int("n", 10, "starts")
	root := fs.String("state-root", os.TempDir(), "parent of the fresh state directories")
	stateFlag := fs.String("state-flag", "--state", "flag naming the state directory (empty: none)")
	asJSON := fs.Bool("json", false, "one JSON line per start")
	tg := tags{}
	fs.Var(tg, "tag", "k=v copied into each JSON record")
	fs.Parse(args)
	argv := fs.Args()
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "usage: loadgen startup [-n N] -- BINARY ARGS...")
		return 2
	}
	hc := &http.Client{Timeout: time.Second}
	var walls []float64
	for i := range *n {
		a := append([]string(nil), argv[1:]...)
		if *stateFlag != "" {
			dir, err := os.MkdirTemp(*root, "physd-start-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			a = append(a, *stateFlag, dir)
		}
		wall, startupMS, err := oneStart(hc, argv[0], a)
		if err != nil {
			fmt.Fprintf(os.Stderr, "start %d: %v\n", i, err)
			return 1
		}
		walls = append(walls, wall)
		if *asJSON {
			b, _ := json.Marshal(map[string]any{"tags": tg, "kind": "startup", "wall_ms": wall, "startup_ms": startupMS})
			fmt.Println(string(b))
		} else {
			fmt.Printf("start %d: exec→/readyz 200 in %.1f ms (startup_ms %d)\n", i, wall, startupMS)
		}
	}
	if !*asJSON {
		slices.Sort(walls)
		fmt.Printf("median %.1f ms over %d starts\n", walls[len(walls)/2], len(walls))
	}
	return 0
}

func oneStart(hc *http.Client, bin string, args []string) (wallMS float64, startupMS int64, err error) {
	cmd := newCmd(bin, args)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 0, 0, err
	}
	type logLine struct {
		Msg       string `json:"msg"`
		Addr      string `json:"addr"`
		StartupMS *int64 `json:"startup_ms"`
	}
	addrc := make(chan string, 1)
	readyc := make(chan int64, 1)
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	go func() {
		dec := json.NewDecoder(stderr)
		for {
			var l logLine
			if err := dec.Decode(&l); err != nil {
				_, _ = io.Copy(io.Discard, stderr)
				return
			}
			switch l.Msg {
			case "listening":
				addrc <- l.Addr
			case "ready":
				if l.StartupMS != nil {
					readyc <- *l.StartupMS
				}
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case <-time.After(20 * time.Second):
		return 0, 0, errors.New("no listening log line within 20 s")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := hc.Get("http://" + addr + "/readyz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			return 0, 0, errors.New("/readyz not 200 within 20 s")
		}
		time.Sleep(200 * time.Microsecond)
	}
	wallMS = float64(time.Since(t0).Microseconds()) / 1e3
	select {
	case startupMS = <-readyc:
	case <-time.After(5 * time.Second):
		startupMS = -1
	}
	return wallMS, startupMS, nil
}

func newCmd(bin string, args []string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Stdout = io.Discard
	return cmd
}
