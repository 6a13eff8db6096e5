// Command fleetscale is the fleet's scale run (issue #28): a NATS hub
// (nats-server processes: one, or a cluster of three with JetStream
// replicas 3), sites × gateways simulated gateways in this process (each a
// physd node polling a simulated temperature every poll-ms, with its own
// NATS connection, uplink and serving side: package fleet, as physd run
// builds them), and the fleet endpoint (a physd fleet process) connected
// to the hub. Over a measured window it reports the hub's CPU (% of one
// core, from /proc) and memory, the fleet endpoint's and this process's,
// can_do through the fleet's MCP endpoint over HTTP (scoped to one site:
// its three gateways; and across the whole fleet), and the end-to-end
// observation delay: from the gateway's device read (the observation's
// timestamp) to its arrival at a separate NATS subscriber, and to its
// arrival at the fleet endpoint (read_ answers from the latest
// observation with its age: delay = answer time − timestamp − age_ms).
//
//	go build -o /tmp/physd ./cmd/physd
//	go build -o /tmp/nats-server github.com/nats-io/nats-server/v2
//	go run ./bench/fleetscale -physd /tmp/physd -nats-server /tmp/nats-server -sites 100 -per-site 3
//
// bench/fleet_scale.sh does all three and writes bench/fleet-results.md.
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/bench/internal/rawmcp"
	"github.com/physd/physd/fleet"
	"github.com/physd/physd/hub"
	"github.com/physd/physd/manifest"
)

const (
	prefix     = manifest.DefaultFleetSubjectPrefix
	benchToken = "fleetscale-operator-token"
)

var streams = hub.FleetStreams{Audit: manifest.DefaultFleetStream, Catalog: fleet.DefaultCatalogStream,
	History: manifest.DefaultFleetHistoryStream, Alarms: manifest.DefaultFleetAlarmStream}

type options struct {
	physd, natsServer    string
	sites, perSite       int
	pollMS, servers      int
	warmup, window       time.Duration
	jsonOut              string
	readEvery, candoStep time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.physd, "physd", "", "the physd binary (runs physd fleet)")
	flag.StringVar(&o.natsServer, "nats-server", "", "the nats-server binary (the hub)")
	flag.IntVar(&o.sites, "sites", 100, "sites")
	flag.IntVar(&o.perSite, "per-site", 3, "gateways per site")
	flag.IntVar(&o.pollMS, "poll-ms", 100, "each gateway's poll interval (100: 10 observations/s)")
	flag.IntVar(&o.servers, "servers", 1, "hub servers: 1, or 3 (a cluster, streams with 3 replicas)")
	flag.DurationVar(&o.warmup, "warmup", 20*time.Second, "run before the measured window")
	flag.DurationVar(&o.window, "window", 60*time.Second, "the measured window")
	flag.DurationVar(&o.readEvery, "read-every", 100*time.Millisecond, "pause between read_ calls")
	flag.DurationVar(&o.candoStep, "cando-every", 100*time.Millisecond, "pause between can_do calls")
	flag.StringVar(&o.jsonOut, "json", "", "write the results as JSON to this file")
	flag.Parse()
	if o.physd == "" || o.natsServer == "" || (o.servers != 1 && o.servers != 3) {
		fmt.Fprintln(os.Stderr, "fleetscale: -physd and -nats-server are required; -servers is 1 or 3")
		os.Exit(2)
	}
	r, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetscale:", err)
		os.Exit(1)
	}
	fmt.Print(r.markdown())
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(r, "", "  ")
		if err := os.WriteFile(o.jsonOut, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "fleetscale:", err)
			os.Exit(1)
		}
	}
}

func run(o options) (*results, error) {
	dir, err := os.MkdirTemp("", "fleetscale-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	users := []hubUser{{name: "admin", password: "admin"}}
	fp := hub.FleetPermissions(prefix, "", streams)
	users = append(users, hubUser{name: "fleet", password: "fleet-pw", perms: &fp})
	var sites []string
	for i := range o.sites {
		site := fmt.Sprintf("s%03d", i)
		sites = append(sites, site)
		sp := hub.SitePermissions(prefix, site, "", streams.Audit, streams.History, streams.Alarms)
		users = append(users, hubUser{name: site, password: site + "-pw", perms: &sp})
	}
	logf("hub: %d nats-server process(es)", o.servers)
	hs, err := startHub(o.natsServer, filepath.Join(dir, "hub"), o.servers, users)
	defer func() {
		for _, s := range hs {
			s.stop()
		}
	}()
	if err != nil {
		return nil, err
	}
	admin, err := nats.Connect(joinURLs(hs), nats.UserInfo("admin", "admin"))
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if err := createStreams(admin, o.servers); err != nil {
		return nil, err
	}

	logf("fleet endpoint: physd fleet")
	f, err := startFleet(o, dir, hs)
	if f != nil {
		defer f.stop()
	}
	if err != nil {
		return nil, err
	}

	total := o.sites * o.perSite
	logf("gateways: %d in this process (%d sites × %d), polling every %d ms", total, o.sites, o.perSite, o.pollMS)
	gws, err := startGateways(o, dir, sites, hubURLs(hs))
	defer func() {
		var wg sync.WaitGroup
		for _, g := range gws {
			wg.Add(1)
			go func() { defer wg.Done(); g.close() }()
		}
		wg.Wait()
	}()
	if err != nil {
		return nil, err
	}
	if err := f.waitGateways(total, 120*time.Second); err != nil {
		return nil, err
	}
	logf("all %d gateways up at the fleet endpoint; warming up %s", total, o.warmup)

	mon := &monitor{}
	sub, err := admin.Subscribe(prefix+".*.*.obs.*", mon.observe)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	time.Sleep(o.warmup)

	logf("measuring for %s", o.window)
	r := &results{Sites: o.sites, PerSite: o.perSite, Gateways: total, PollMS: o.pollMS, HubServers: o.servers, WindowS: o.window.Seconds(), LoadBefore: loadavg()}
	var hubPIDs []int
	for _, s := range hs {
		hubPIDs = append(hubPIDs, s.cmd.Process.Pid)
	}
	cpu0 := map[string]float64{"hub": cpuSeconds(hubPIDs...), "fleet": cpuSeconds(f.cmd.Process.Pid), "gateways": cpuSeconds(os.Getpid())}
	sent0 := sentBy(gws)
	mon.start()
	ctx, cancel := context.WithTimeout(context.Background(), o.window)
	defer cancel()
	var wg sync.WaitGroup
	cd := &candoStats{}
	rd := &readStats{}
	wg.Add(2)
	go func() { defer wg.Done(); cd.loop(ctx, f, sites, o.candoStep) }()
	go func() { defer wg.Done(); rd.loop(ctx, f, gws, o.readEvery) }()
	peak := &rssPeaks{}
	go peak.sample(ctx, map[string][]int{"hub": hubPIDs, "fleet": {f.cmd.Process.Pid}, "gateways": {os.Getpid()}})
	<-ctx.Done()
	wg.Wait()
	mon.stop()
	secs := o.window.Seconds()
	r.HubCPUPercent = 100 * (cpuSeconds(hubPIDs...) - cpu0["hub"]) / secs
	r.FleetCPUPercent = 100 * (cpuSeconds(f.cmd.Process.Pid) - cpu0["fleet"]) / secs
	r.GatewaysCPUPercent = 100 * (cpuSeconds(os.Getpid()) - cpu0["gateways"]) / secs
	r.HubRSSMiB, r.FleetRSSMiB, r.GatewaysRSSMiB = peak.max("hub"), peak.max("fleet"), peak.max("gateways")
	sent1 := sentBy(gws)
	r.ObsSentPerS = float64(sent1.core-sent0.core) / secs
	r.ObsDroppedAtGateways = sent1.dropped - sent0.dropped
	r.LoadAfter = loadavg()
	mon.report(r, secs)
	cd.report(r)
	rd.report(r)
	r.Machine = machine()
	return r, nil
}

// createStreams creates the fleet's four streams (the hub operator's job)
// with a replica per hub server.
func createStreams(nc *nats.Conn, replicas int) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for _, sc := range []jetstream.StreamConfig{
		fleet.AuditStreamConfig(streams.Audit, prefix, replicas), fleet.HistoryStreamConfig(streams.History, prefix, replicas),
		fleet.AlarmStreamConfig(streams.Alarms, prefix, replicas), fleet.CatalogStreamConfig(streams.Catalog, prefix, replicas),
	} {
		var err error
		for end := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err = js.CreateStream(ctx, sc)
			cancel()
			if err == nil || time.Now().After(end) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("stream %s: %w", sc.Name, err)
		}
	}
	return nil
}

// startGateways starts the gateways, sixteen at a time.
func startGateways(o options, dir string, sites []string, urls []string) ([]*gateway, error) {
	type job struct {
		site, device string
		seed         int
	}
	jobs := make(chan job)
	var mu sync.Mutex
	var gws []*gateway
	var first error
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				g, err := startGateway(filepath.Join(dir, "gateways"), j.site, j.device, j.seed, o.pollMS, urls, j.site+"-pw")
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("gateway %s/%s: %w", j.site, j.device, err)
				}
				if g != nil {
					gws = append(gws, g)
				}
				mu.Unlock()
			}
		}()
	}
	seed := 0
	for _, site := range sites {
		for k := range o.perSite {
			seed++
			jobs <- job{site, fmt.Sprintf("gw_%d", k+1), seed}
		}
	}
	close(jobs)
	wg.Wait()
	return gws, first
}

type sent struct{ core, dropped uint64 }

func sentBy(gws []*gateway) sent {
	var s sent
	for _, g := range gws {
		st := g.up.Stats()
		s.core += st.Core
		s.dropped += st.Dropped
	}
	return s
}

// fleetProc is the physd fleet process.
type fleetProc struct {
	cmd   *exec.Cmd
	url   string // http://addr
	hc    *http.Client
	ready chan struct{}
	done  chan struct{}
}

func startFleet(o options, dir string, hs []*hubServer) (*fleetProc, error) {
	fdir := filepath.Join(dir, "fleet")
	if err := os.MkdirAll(fdir, 0o700); err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(benchToken))
	files := map[string]string{
		"fleet.pw": "fleet-pw\n",
		"fleet.yml": fmt.Sprintf("id: fleet_bench\ncall_timeout_ms: 2000\ndo_timeout_ms: 5000\nreplicas: %d\nnats:\n  urls: [%s]\n  user: fleet\n  password_file: fleet.pw\n",
			o.servers, strings.Join(hubURLs(hs), ", ")),
		"policy.yml": fmt.Sprintf("physmcp_policy_version: \"0.1\"\nidentity:\n  tokens:\n    - {id: bench, sha256: %s, role: operator}\n", hex.EncodeToString(sum[:])),
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(fdir, name), []byte(text), 0o600); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(o.physd, "fleet", "--config", filepath.Join(fdir, "fleet.yml"), "--policy", filepath.Join(fdir, "policy.yml"),
		"--http", "127.0.0.1:0", "--state", filepath.Join(fdir, "state"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "fleet.log"))
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	hc := rawmcp.NewHTTPClient(8)
	hc.Transport = bearer{hc.Transport}
	f := &fleetProc{cmd: cmd, hc: hc, ready: make(chan struct{}), done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(f.done)
		defer logFile.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		readyOnce := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logFile, line)
			var l struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &l) != nil {
				continue
			}
			switch l.Msg {
			case "listening":
				select {
				case addr <- l.Addr:
				default:
				}
			case "ready":
				readyOnce.Do(func() { close(f.ready) })
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case a := <-addr:
		f.url = "http://" + a
	case <-f.done:
		return f, fmt.Errorf("physd fleet exited (log: %s)", filepath.Join(dir, "fleet.log"))
	case <-time.After(60 * time.Second):
		return f, fmt.Errorf("physd fleet did not listen within 60 s")
	}
	select {
	case <-f.ready:
	case <-time.After(60 * time.Second):
		return f, fmt.Errorf("physd fleet not ready within 60 s")
	}
	return f, nil
}

type bearer struct{ rt http.RoundTripper }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r.Header.Set("Authorization", "Bearer "+benchToken)
	return b.rt.RoundTrip(r)
}

func (f *fleetProc) stop() { stopProcess(f.cmd, f.done) }

// waitGateways waits until the endpoint's /status lists n gateways up.
func (f *fleetProc) waitGateways(n int, d time.Duration) error {
	up := 0
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		resp, err := f.hc.Get(f.url + "/status")
		if err != nil {
			continue
		}
		var st struct {
			Fleet struct {
				Members []struct{ State string }
			}
		}
		_ = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		up = 0
		for _, m := range st.Fleet.Members {
			if m.State == "up" {
				up++
			}
		}
		if up >= n {
			return nil
		}
	}
	return fmt.Errorf("%d of %d gateways up at the fleet endpoint after %s", up, n, d)
}

var callID atomic.Int64

// call is one tools/call at the fleet's /mcp: its structured content and
// how long it took.
func (f *fleetProc) call(ctx context.Context, tool string, args any) (map[string]any, time.Time, time.Duration, error) {
	b, _ := json.Marshal(args)
	start := time.Now()
	raw, err := rawmcp.Call(ctx, f.hc, f.url+"/mcp", callID.Add(1), tool, b)
	took := time.Since(start)
	if err != nil {
		return nil, start, took, err
	}
	var out map[string]any
	err = json.Unmarshal(raw, &out)
	return out, start, took, err
}

// monitor is a NATS subscriber of every observation (as the fleet
// endpoint subscribes): the delay from the device read (the
// observation's timestamp) to its arrival here.
type monitor struct {
	on     atomic.Bool
	mu     sync.Mutex
	delays []time.Duration
	count  atomic.Uint64
}

func (m *monitor) start() { m.on.Store(true) }
func (m *monitor) stop()  { m.on.Store(false) }

func (m *monitor) observe(msg *nats.Msg) {
	if !m.on.Load() {
		return
	}
	now := time.Now()
	m.count.Add(1)
	var o struct {
		Timestamp time.Time `json:"timestamp"`
		AgeMS     int64     `json:"age_ms"`
	}
	if json.Unmarshal(msg.Data, &o) != nil || o.AgeMS > 0 {
		return // a refresh of an unchanged value carries its age: not a fresh read
	}
	m.mu.Lock()
	m.delays = append(m.delays, now.Sub(o.Timestamp))
	m.mu.Unlock()
}

func (m *monitor) report(r *results, secs float64) {
	r.ObsReceivedPerS = float64(m.count.Load()) / secs
	m.mu.Lock()
	defer m.mu.Unlock()
	r.ObsDelayNATS = summarize(m.delays)
}

// candoStats are can_do calls at the fleet: scoped to one site (its
// gateways), and across the fleet (every gateway), one at a time.
type candoStats struct {
	site, all             []time.Duration
	incomplete, errs      int
	siteMatched, allMatch float64
	firstErr              string
}

func (c *candoStats) loop(ctx context.Context, f *fleetProc, sites []string, pause time.Duration) {
	for i := 0; ctx.Err() == nil; i++ {
		args := map[string]any{"intent": map[string]any{"semantic_tags": []string{"heating"}, "action": "set", "value": 20}}
		fleetWide := i%5 == 4
		if !fleetWide {
			args["scope"] = []string{sites[rand.IntN(len(sites))]}
		}
		out, _, took, err := f.call(ctx, "can_do", args)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.errs++
			if c.firstErr == "" {
				c.firstErr = err.Error()
			}
			continue
		}
		md, _ := out["metadata"].(map[string]any)
		consulted, _ := md["peers_consulted"].(float64)
		answered, _ := md["responses_received"].(float64)
		if answered < consulted || consulted == 0 {
			c.incomplete++
		}
		if fleetWide {
			c.all = append(c.all, took)
			c.allMatch = consulted
		} else {
			c.site = append(c.site, took)
			c.siteMatched = consulted
		}
		time.Sleep(pause)
	}
}

func (c *candoStats) report(r *results) {
	r.CanDoSite, r.CanDoFleet = summarize(c.site), summarize(c.all)
	r.CanDoSiteGateways, r.CanDoFleetGateways = int(c.siteMatched), int(c.allMatch)
	r.CanDoIncomplete, r.CanDoErrors, r.CanDoFirstError = c.incomplete, c.errs, c.firstErr
}

// readStats are read_ calls at the fleet of a random gateway's
// temperature, answered from the endpoint's latest observation: its age,
// and the delay from the device read to the endpoint's receipt (answer
// time − timestamp − age_ms, an upper bound: the answer's way back is in
// it).
type readStats struct {
	ages, delays []time.Duration
	notCached    int
	errs         int
	firstErr     string
}

func (s *readStats) loop(ctx context.Context, f *fleetProc, gws []*gateway, pause time.Duration) {
	for ctx.Err() == nil {
		g := gws[rand.IntN(len(gws))]
		out, start, took, err := f.call(ctx, "read_temperature", map[string]any{"site": g.site, "source": g.device, "zone": "zone_a"})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.errs++
			if s.firstErr == "" {
				s.firstErr = err.Error()
			}
			continue
		}
		ts, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(out["timestamp"]))
		age, _ := out["age_ms"].(float64)
		if out["cached"] != true || ts.IsZero() {
			s.notCached++
			continue
		}
		ageD := time.Duration(age) * time.Millisecond
		s.ages = append(s.ages, ageD)
		s.delays = append(s.delays, start.Add(took).Sub(ts)-ageD)
		time.Sleep(pause)
	}
}

func (s *readStats) report(r *results) {
	r.ReadAge, r.ObsDelayFleet = summarize(s.ages), summarize(s.delays)
	r.ReadNotCached, r.ReadErrors, r.ReadFirstError = s.notCached, s.errs, s.firstErr
}

// dist summarizes durations in milliseconds.
type dist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

func summarize(ds []time.Duration) dist {
	if len(ds) == 0 {
		return dist{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return dist{N: len(s), P50: ms(at(0.50)), P99: ms(at(0.99)), Max: ms(s[len(s)-1])}
}

// cpuSeconds is the processes' CPU time so far (utime + stime).
func cpuSeconds(pids ...int) float64 {
	total := 0.0
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command's closing parenthesis.
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		ut, _ := strconv.ParseFloat(fields[11], 64)
		st, _ := strconv.ParseFloat(fields[12], 64)
		total += (ut + st) / clkTck()
	}
	return total
}

var clkOnce = sync.OnceValue(func() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if v, perr := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && perr == nil && v > 0 {
		return v
	}
	return 100
})

func clkTck() float64 { return clkOnce() }

// rssMiB is the processes' resident memory now, in MiB.
func rssMiB(pids ...int) float64 {
	total := 0.0
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				total += kb / 1024
			}
		}
	}
	return total
}

// rssPeaks samples the processes' RSS every second and keeps the peak.
type rssPeaks struct {
	mu   sync.Mutex
	peak map[string]float64
}

func (p *rssPeaks) sample(ctx context.Context, groups map[string][]int) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		p.mu.Lock()
		if p.peak == nil {
			p.peak = map[string]float64{}
		}
		for name, pids := range groups {
			p.peak[name] = max(p.peak[name], rssMiB(pids...))
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *rssPeaks) max(name string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peak[name]
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func machine() string {
	cpus, model := 0, ""
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		b, _ := io.ReadAll(f)
		f.Close()
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "processor") {
				cpus++
			}
			if v, ok := strings.CutPrefix(l, "model name"); ok && model == "" {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		mem = strings.Join(strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1:], " ")
	}
	return fmt.Sprintf("%d CPUs (%s), MemTotal %s", cpus, model, mem)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s fleetscale: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}
