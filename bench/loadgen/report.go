package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// line is any record of the raw results file: a load Record, a startup
// record or an rss record (written by run.sh).
type line struct {
	Record
	WallMS    float64 `json:"wall_ms"`
	StartupMS float64 `json:"startup_ms"`
	VmRSSkB   float64 `json:"vmrss_kb"`
	VmHWMkB   float64 `json:"vmhwm_kb"`
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// report turns the raw JSON lines of run.sh into the results table.
func report(args []string) int {
	fs := flag.NewFlagSet("loadgen report", flag.ExitOnError)
	in := fs.String("in", "", "raw results (JSON lines)")
	md := fs.String("md", "", "also write the report (markdown) here")
	var hdr []string
	fs.Func("h", "header line for the report (repeatable)", func(s string) error { hdr = append(hdr, s); return nil })
	before := fs.String("before", "", "the ref the server tagged before was built from (run.sh BEFORE_REF)")
	fs.Parse(args)
	f, err := os.Open(*in)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	var lines []line
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l line
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			lines = append(lines, l)
		}
	}
	sel := func(kv ...string) []line {
		var out []line
	next:
		for _, l := range lines {
			for i := 0; i+1 < len(kv); i += 2 {
				v := l.Tags[kv[i]]
				if kv[i] == "kind" {
					v = l.Kind
				}
				if v != kv[i+1] {
					continue next
				}
			}
			out = append(out, l)
		}
		return out
	}
	field := func(ls []line, f func(line) float64) []float64 {
		var out []float64
		for _, l := range ls {
			out = append(out, f(l))
		}
		return out
	}
	byPair := func(ls []line) map[string]line {
		m := map[string]line{}
		for _, l := range ls {
			m[l.Tags["pair"]] = l
		}
		return m
	}
	pairs := func(ls []line) []string {
		var ps []string
		for _, l := range ls {
			if !slices.Contains(ps, l.Tags["pair"]) {
				ps = append(ps, l.Tags["pair"])
			}
		}
		slices.SortFunc(ps, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
		return ps
	}
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**MISSED**"
	}
	ms := func(us float64) string { return fmt.Sprintf("%.2f ms", us/1e3) }
	totalErr := 0
	for _, l := range lines {
		totalErr += l.Errors
	}

	for _, h := range hdr {
		p("%s\n", h)
	}
	p("\n| metric | physd | bare go-sdk (echo) | physd/bare | target | verdict |\n|---|---|---|---|---|---|\n")

	// (a) read_ cache hit, alternating pairs: physd against the typed bare
	// server (the target) and the raw one.
	pt, pl := byPair(sel("phase", "read", "server", "physd", "mode", "tput")), byPair(sel("phase", "read", "server", "physd", "mode", "lat"))
	rps := func(l line) float64 { return l.RPS }
	p50 := func(l line) float64 { return l.P50us }
	p99 := func(l line) float64 { return l.P99us }
	cpu := func(l line) float64 { return l.SrvCPUus }
	vals := func(m map[string]line) []line {
		var out []line
		for _, l := range m {
			out = append(out, l)
		}
		return out
	}
	type ratios struct{ tput, lat, cpu []float64 }
	readRatios := func(base string) (ratios, map[string]line, map[string]line) {
		bt, bl := byPair(sel("phase", "read", "server", base, "mode", "tput")), byPair(sel("phase", "read", "server", base, "mode", "lat"))
		var r ratios
		for _, k := range pairs(sel("phase", "read")) {
			if a, ok := pt[k]; ok {
				if c, ok := bt[k]; ok && c.RPS > 0 {
					r.tput = append(r.tput, a.RPS/c.RPS)
					if c.SrvCPUus > 0 {
						r.cpu = append(r.cpu, a.SrvCPUus/c.SrvCPUus)
					}
				}
			}
			if a, ok := pl[k]; ok {
				if c, ok := bl[k]; ok && c.P50us > 0 {
					r.lat = append(r.lat, a.P50us/c.P50us)
				}
			}
		}
		return r, bt, bl
	}
	rb, bt, bl := readRatios("bare")
	rr, rt, rl := readRatios("raw")
	if len(rb.tput) > 0 {
		r := median(rb.tput)
		p("| read_ cache-hit throughput, c=8 (median of %d A/B pairs) | %.0f calls/s | %.0f calls/s | **%.2f×** (median of pair ratios) | ≥ 0.8× | %s |\n",
			len(rb.tput), median(field(vals(pt), rps)), median(field(vals(bt), rps)), r, verdict(r >= 0.8))
		p("| server CPU per call at c=8 (/proc/PID/stat) | %.0f µs | %.0f µs | %.2f× | – | |\n",
			median(field(vals(pt), cpu)), median(field(vals(bt), cpu)), median(rb.cpu))
	}
	if len(rb.lat) > 0 {
		p("| read_ cache-hit p50, c=1 | %s | %s | %.2f× | – | |\n",
			ms(median(field(vals(pl), p50))), ms(median(field(vals(bl), p50))), median(rb.lat))
	}
	if len(rr.tput) > 0 {
		p("| *stricter baseline: bare echo registered like physd (Server.AddTool, raw handler)*: throughput c=8 / CPU per call / p50 c=1 | | %.0f calls/s / %.0f µs / %s | %.2f× / %.2f× / %.2f× | (≥ 0.8×) | %s |\n",
			median(field(vals(rt), rps)), median(field(vals(rt), cpu)), ms(median(field(vals(rl), p50))),
			median(rr.tput), median(rr.cpu), median(rr.lat), verdict(median(rr.tput) >= 0.8))
	}
	// (b) do_.
	if d := sel("phase", "do", "server", "physd"); len(d) > 0 {
		be := sel("phase", "do", "server", "bare")
		v := median(field(d, p50))
		p("| do_ full path p50, c=1 (ledger + audit fsynced) | %s | %s | %.1f× | ≤ 3 ms | %s |\n", ms(v), ms(median(field(be, p50))),
			v/median(field(be, p50)), verdict(v <= 3000))
		p("| do_ full path p99, c=1 | %s | %s | | – | |\n", ms(median(field(d, p99))), ms(median(field(be, p99))))
	}
	// (c) can_do.
	if d := sel("phase", "cando", "server", "physd"); len(d) > 0 {
		be := sel("phase", "cando", "server", "bare")
		v := median(field(d, p50))
		p("| can_do p50, c=1, 50 capabilities | %s | %s | %.1f× | ≤ 1 ms | %s |\n", ms(v), ms(median(field(be, p50))),
			v/median(field(be, p50)), verdict(v <= 1000))
		p("| can_do p99, c=1 | %s | %s | | – | |\n", ms(median(field(d, p99))), ms(median(field(be, p99))))
	}
	// (d) RSS.
	for _, when := range []string{"after_calls", "idle_30s", "after_load"} {
		ph, bh := sel("kind", "rss", "server", "physd", "when", when), sel("kind", "rss", "server", "bare", "when", when)
		if len(ph) == 0 {
			continue
		}
		target, v := "–", ph[0].VmRSSkB/1024
		ver := ""
		if when != "after_load" {
			target, ver = "≤ 30 MB", verdict(v <= 30)
		}
		bare := "–"
		if len(bh) > 0 {
			bare = fmt.Sprintf("%.1f MB", bh[0].VmRSSkB/1024)
		}
		label := map[string]string{"after_calls": "idle RSS after start + a few calls", "idle_30s": "idle RSS after 30 s idle",
			"after_load": "RSS after the read_ load (VmHWM peak)"}[when]
		val := fmt.Sprintf("%.1f MB", v)
		if when == "after_load" {
			val = fmt.Sprintf("%.1f MB (peak %.1f MB)", v, ph[0].VmHWMkB/1024)
		}
		p("| %s | %s | %s | | %s | %s |\n", label, val, bare, target, ver)
	}
	// (e) start to ready.
	if s := sel("kind", "startup", "server", "physd"); len(s) > 0 {
		w := field(s, func(l line) float64 { return l.WallMS })
		v := median(w)
		p("| start → /readyz 200 (median of %d; min %.0f, max %.0f) | %.1f ms | | | ≤ 200 ms | %s |\n",
			len(s), slices.Min(w), slices.Max(w), v, verdict(v <= 200))
		p("| startup_ms log field (median) | %.0f ms | | | | |\n", median(field(s, func(l line) float64 { return l.StartupMS })))
	}
	p("\nErrors across all measured calls: %d (every non-200, JSON-RPC error, isError, read_ quality≠good, do_ status≠success counts).\n", totalErr)

	// Details.
	if len(rb.tput) > 0 {
		p("\n### read_ pairs (order alternates)\n\n| pair | order | physd calls/s | bare calls/s | raw calls/s | physd/bare | physd/raw | CPU-µs/call physd / bare / raw | p50 c=1 physd / bare / raw | uncached physd answers |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, k := range pairs(sel("phase", "read")) {
			a, c, r := pt[k], bt[k], rt[k]
			p("| %s | %s | %.0f | %.0f | %.0f | %.2f | %.2f | %.0f / %.0f / %.0f | %s / %s / %s | %d/%d |\n", k, a.Tags["order"], a.RPS, c.RPS, r.RPS,
				a.RPS/c.RPS, a.RPS/r.RPS, a.SrvCPUus, c.SrvCPUus, r.SrvCPUus, ms(pl[k].P50us), ms(bl[k].P50us), ms(rl[k].P50us),
				a.Uncached+pl[k].Uncached, a.Calls+pl[k].Calls)
		}
	}
	for _, ph := range []string{"do", "cando"} {
		d, be := byPair(sel("phase", ph, "server", "physd")), byPair(sel("phase", ph, "server", "bare"))
		if len(d) == 0 {
			continue
		}
		p("\n### %s rounds (c=1)\n\n| round | physd calls | physd p50 | p90 | p99 | max | bare echo p50 | bare p99 |\n|---|---|---|---|---|---|---|---|\n", ph)
		for _, k := range pairs(sel("phase", ph)) {
			a, c := d[k], be[k]
			p("| %s | %d | %s | %s | %s | %s | %s | %s |\n", k, a.Calls, ms(a.P50us), ms(a.P90us), ms(a.P99us), ms(a.MaxUS), ms(c.P50us), ms(c.P99us))
		}
	}
	beforeAfter(p, sel, *before)
	fmt.Print(b.String())
	if *md != "" {
		if err := os.WriteFile(*md, []byte(b.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

// beforeAfter is the section run.sh writes with BEFORE_REF: physd built
// from that ref (server tag before) against this tree (physd), each
// against the bare go-sdk server measured in the same rounds.
func beforeAfter(p func(string, ...any), sel func(...string) []line, ref string) {
	if len(sel("server", "before")) == 0 {
		return
	}
	p50 := func(ls []line) float64 { return median(fieldOf(ls, func(l line) float64 { return l.P50us })) }
	rps := func(ls []line) float64 { return median(fieldOf(ls, func(l line) float64 { return l.RPS })) }
	p("\n### Before (%s) and after, in this run\n\n| metric | before | after | bare go-sdk | before/bare | after/bare |\n|---|---|---|---|---|---|\n", ref)
	row := func(label string, v func([]line) float64, unit string, kv ...string) {
		get := func(server string) float64 { return v(sel(append([]string{"server", server}, kv...)...)) }
		b, a, bare := get("before"), get("physd"), get("bare")
		if b == 0 || a == 0 || bare == 0 {
			return
		}
		f := func(x float64) string {
			if unit == "ms" {
				return fmt.Sprintf("%.2f ms", x/1e3)
			}
			return fmt.Sprintf("%.0f calls/s", x)
		}
		p("| %s | %s | %s | %s | %.2f× | %.2f× |\n", label, f(b), f(a), f(bare), b/bare, a/bare)
	}
	row("read_ cache-hit throughput, c=8", rps, "rps", "phase", "read", "mode", "tput")
	row("read_ cache-hit p50, c=1", p50, "ms", "phase", "read", "mode", "lat")
	row("do_ full path p50, c=1", p50, "ms", "phase", "do")
	row("can_do p50, c=1, 50 capabilities", p50, "ms", "phase", "cando")
}

func fieldOf(ls []line, f func(line) float64) []float64 {
	out := make([]float64, 0, len(ls))
	for _, l := range ls {
		out = append(out, f(l))
	}
	return out
}
