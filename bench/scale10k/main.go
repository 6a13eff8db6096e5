// Command scale10k measures what physd costs at the scale of a plant:
// Devices modbus-sim instances of Points points each (bench/scalesite's
// manifest: every point polled every PollMS, history on, MQTT when a broker
// is given), and reports physd's CPU (share of one core), RSS, the age of
// the observations an agent reads, history.db's growth and the latency of
// do_ calls under that load, as a Markdown section (bench/scale10k.sh runs
// it and appends the section to bench/scale-results.md).
//
// It measures physd from outside, as an operator would: CPU and memory from
// /proc, observation ages and do_ latency through the MCP endpoint, counters
// from /metrics. The phases:
//
//  1. start the devices (and mosquitto with -mqtt auto), then physd;
//  2. settle: start-up, the first polls and history flush are not measured;
//  3. steady: CPU and RSS over the window, while a sampler reads the
//     observation resource (physmcp://obs/<point>) of a random point every
//     -sample-every and records its age_ms;
//  4. do_: repeated do_ calls on one setpoint (a fresh idempotency key
//     each), one every -do-every (an agent's pace, not a flood: back to
//     back, the do_ calls' own fsyncs would be the load), with the same
//     load running.
//
// With -site opcua the devices are one node-opcua server
// (examples/opcua/server/server.js --points devices×points) instead of the
// modbus-sim instances, and every point is a monitored item with a
// deadband (bench/scalesite's OPC UA site); the phases and the report
// stay.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/physd/physd/bench/internal/rawmcp"
	"github.com/physd/physd/bench/scalesite"
)

type config struct {
	site                  string // modbus or opcua
	node, opcuaServer     string // the Node binary and examples/opcua/server (-site opcua)
	opcuaSlices           int    // server.js --update-slices
	physd, sim, mosquitto string
	devices, points       int
	pollMS                int
	settle, measure, do   time.Duration
	sampleEvery, doEvery  time.Duration
	mqtt                  string
	label, out            string
	keep                  bool
	profile               string
	physdEnv, physdArgs   string
}

func main() {
	var c config
	flag.StringVar(&c.physd, "physd", "", "the physd binary")
	flag.StringVar(&c.sim, "sim", "", "the modbus-sim binary (-site modbus)")
	flag.StringVar(&c.site, "site", "modbus", `"modbus": modbus-sim devices; "opcua": one node-opcua server holding every point as a monitored item`)
	flag.StringVar(&c.node, "node", "", "the Node binary (-site opcua)")
	flag.StringVar(&c.opcuaServer, "opcua-server", "", "the directory of server.js and its node_modules (-site opcua)")
	flag.IntVar(&c.opcuaSlices, "opcua-slices", 1, "the OPC UA server sets its points in this many slices a second (1: all in one turn of its event loop)")
	flag.StringVar(&c.mosquitto, "mosquitto", "mosquitto", "the mosquitto binary (with -mqtt auto)")
	flag.IntVar(&c.devices, "devices", 20, "Modbus TCP devices (modbus-sim instances), or the OPC UA site's zones")
	flag.IntVar(&c.points, "points", 500, "points per device")
	flag.IntVar(&c.pollMS, "poll-ms", 1000, "every point's poll_ms")
	flag.DurationVar(&c.settle, "settle", 60*time.Second, "time after ready before measuring")
	flag.DurationVar(&c.measure, "measure", 120*time.Second, "the steady window: CPU, RSS, observation ages, history growth")
	flag.DurationVar(&c.do, "do", 60*time.Second, "the do_ window: repeated do_ calls under the same load")
	flag.DurationVar(&c.doEvery, "do-every", 200*time.Millisecond, "a do_ call begins this often (0: one after another, back to back)")
	flag.DurationVar(&c.sampleEvery, "sample-every", 200*time.Millisecond, "how often the sampler reads a random point's observation resource")
	flag.StringVar(&c.mqtt, "mqtt", "", `"auto": start mosquitto on a free port and publish to it; a URL: publish there; "": no MQTT`)
	flag.StringVar(&c.label, "label", "run", "the run's name in the report")
	flag.StringVar(&c.out, "out", "", "append the Markdown section to this file (default: stdout only)")
	flag.BoolVar(&c.keep, "keep", false, "keep the work directory (logs, manifest, state)")
	flag.StringVar(&c.profile, "profile", "", "after the steady window, save physd's CPU (30 s), heap and allocs profiles here (physd built with -tags pprof)")
	flag.StringVar(&c.physdEnv, "physd-env", "", "extra environment for physd, space separated (e.g. GOGC=200)")
	flag.StringVar(&c.physdArgs, "physd-args", "", "extra physd run flags, space separated (e.g. --history-max-mb 0)")
	flag.Parse()
	switch {
	case c.site != "modbus" && c.site != "opcua":
		fmt.Fprintln(os.Stderr, "scale10k: -site is modbus or opcua")
		os.Exit(2)
	case c.physd == "" || (c.site == "modbus" && c.sim == "") || (c.site == "opcua" && (c.node == "" || c.opcuaServer == "")):
		fmt.Fprintln(os.Stderr, "scale10k: -physd, and -sim (modbus) or -node and -opcua-server (opcua), are required (bench/scale10k.sh builds and finds them)")
		os.Exit(2)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "scale10k:", err)
		os.Exit(1)
	}
}

// procs are the processes the run started, stopped at its end.
type procs struct {
	mu   sync.Mutex
	list []*exec.Cmd
}

func (p *procs) start(cmd *exec.Cmd) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	p.mu.Lock()
	p.list = append(p.list, cmd)
	p.mu.Unlock()
	return nil
}

func (p *procs) stopAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range slices.Backward(p.list) {
		if c.ProcessState == nil {
			_ = c.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = c.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = c.Process.Kill()
				<-done
			}
		}
	}
}

func run(c config) error {
	work, err := os.MkdirTemp("", "physd-scale10k-")
	if err != nil {
		return err
	}
	if !c.keep {
		defer os.RemoveAll(work)
	} else {
		fmt.Fprintln(os.Stderr, "work directory:", work)
	}
	ps := &procs{}
	defer ps.stopAll()
	load0 := loadavg()
	began := time.Now()

	var site, control scalesite.Site
	devicePID := 0 // the OPC UA server, whose CPU is reported beside physd's
	if c.site == "opcua" {
		site = scalesite.Site{Groups: c.devices, Points: c.points, PollMS: c.pollMS}
		if site.OPCUA, devicePID, err = startOPCUAServer(c, work, ps, site.ServerPoints()); err != nil {
			return err
		}
		// The control: 20 of the same server's points (the server keeps
		// moving all of them).
		control = scalesite.Site{OPCUA: site.OPCUA, Groups: 1, Points: 20, PollMS: c.pollMS}
	} else {
		addrs, err := startSims(c, work, ps)
		if err != nil {
			return err
		}
		site = scalesite.Site{Addrs: addrs, Points: c.points, PollMS: c.pollMS}
		control = scalesite.Site{Addrs: addrs[:1], Points: 20, PollMS: c.pollMS}
	}

	mqttURL := c.mqtt
	if c.mqtt == "auto" {
		if mqttURL, err = startMosquitto(c.mosquitto, work, ps); err != nil {
			return err
		}
	}

	var ppAddr string
	if c.profile != "" {
		if ppAddr, err = freeAddr(); err != nil {
			return err
		}
	}
	main, err := startPhysd(c, ps, filepath.Join(work, "main"), site, mqttURL, ppAddr)
	if err != nil {
		return err
	}
	pid, httpAddr, startup, state := main.cmd.Process.Pid, main.addr, main.startup, main.state
	endpoint := "http://" + httpAddr + "/mcp"
	hc := rawmcp.NewHTTPClient(4)
	rssAtReady := readStatus(pid)

	fmt.Fprintf(os.Stderr, "== ready after %v\n", startup.Round(time.Millisecond))
	var subscribed time.Duration
	if c.site == "opcua" {
		// Ready is before the server took the monitored items: the
		// settle counts from when it holds them all (a starved server
		// takes minutes), so the window measures the monitored load.
		want := float64(site.Capabilities()) // every one is monitored
		if subscribed, err = waitMetric(hc, "http://"+httpAddr+"/metrics", "physd_bus_monitored_items", want, 5*time.Minute); err != nil {
			return err
		}
		subscribed += startup
		fmt.Fprintf(os.Stderr, "== %v monitored items after %v\n", want, subscribed.Round(time.Millisecond))
	}
	fmt.Fprintf(os.Stderr, "== settling %v\n", c.settle)
	time.Sleep(c.settle)

	fmt.Fprintf(os.Stderr, "== steady window %v\n", c.measure)
	r := &report{c: c, site: site, mqtt: mqttURL != "", startup: startup, subscribed: subscribed, rssAtReady: rssAtReady, load0: load0}
	r.metrics0, _ = scrape(hc, "http://"+httpAddr+"/metrics")
	hist0, histAt0 := fileSize(filepath.Join(state, "history.db")), time.Now()
	cpu0, wall0, io0, dev0 := procCPU(pid), time.Now(), writeBytes(pid), procCPU(devicePID)
	stopRSS := sampleRSS(pid, &r.rss)
	ages := sampleAges(hc, endpoint, c, site, c.measure)
	r.cpuShare = float64(procCPU(pid)-cpu0) / float64(time.Since(wall0).Microseconds())
	r.deviceCPUShare = float64(procCPU(devicePID)-dev0) / float64(time.Since(wall0).Microseconds())
	r.diskWrites = float64(writeBytes(pid)-io0) / time.Since(wall0).Seconds()
	stopRSS()
	r.final = readStatus(pid)
	r.rollup = readRollup(pid)
	r.ages = ages
	r.metrics1, _ = scrape(hc, "http://"+httpAddr+"/metrics")
	r.histBytes, r.histWindow = fileSize(filepath.Join(state, "history.db"))-hist0, time.Since(histAt0)

	if c.profile != "" {
		if err := saveProfiles(c.profile, ppAddr); err != nil {
			fmt.Fprintln(os.Stderr, "profiles:", err)
		}
	}

	fmt.Fprintf(os.Stderr, "== do_ window %v on %s\n", c.do, scalesite.SetpointTool(0))
	cpu1, wall1, dev1 := procCPU(pid), time.Now(), procCPU(devicePID)
	traced := make(chan struct{})
	if c.profile != "" {
		// An execution trace of the do_ window's first 20 s: where a slow
		// do_ waited (go tool trace -pprof=syscall|sync|sched trace.out).
		go func() { defer close(traced); saveTrace(c.profile, ppAddr, min(20*time.Second, c.do)) }()
	} else {
		close(traced)
	}
	r.do = doCalls(hc, endpoint, scalesite.SetpointTool(0), c.do, c.doEvery)
	<-traced
	r.doCPUShare = float64(procCPU(pid)-cpu1) / float64(time.Since(wall1).Microseconds())
	r.doDeviceCPUShare = float64(procCPU(devicePID)-dev1) / float64(time.Since(wall1).Microseconds())
	r.historyFile = fileSize(filepath.Join(state, "history.db"))
	main.stop()

	// The control: the same do_ window on a physd of one device's 20
	// points, on the same machine right after, so the do_ latency under the
	// load can be told from what this machine's disk and neighbours give.
	fmt.Fprintf(os.Stderr, "== control: do_ window %v on a site of 20 points\n", c.do)
	ctl, err := startPhysd(c, ps, filepath.Join(work, "control"), control, "", "")
	if err != nil {
		return err
	}
	time.Sleep(5 * time.Second)
	r.control = doCalls(hc, "http://"+ctl.addr+"/mcp", scalesite.SetpointTool(0), c.do, c.doEvery)
	ctl.stop()
	r.load1 = loadavg()
	r.elapsed = time.Since(began)

	md := r.markdown()
	fmt.Print(md)
	if c.out != "" {
		f, err := os.OpenFile(c.out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.WriteString(f, md); err != nil {
			return err
		}
	}
	if r.do.errors > 0 || r.ages.errors > 0 || r.control.errors > 0 {
		return fmt.Errorf("%d do_ errors (first: %s), %d sampler errors (first: %s)", r.do.errors, r.do.first, r.ages.errors, r.ages.first)
	}
	return nil
}

// startSims starts c.devices modbus-sim instances of c.points points on
// free loopback ports and returns their addresses.
func startSims(c config, work string, ps *procs) ([]string, error) {
	fmt.Fprintf(os.Stderr, "== %d devices × %d points (modbus-sim -points)\n", c.devices, c.points)
	var addrs []string
	for i := range c.devices {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		log := filepath.Join(work, fmt.Sprintf("sim%02d.log", i+1))
		cmd := exec.Command(c.sim, "-addr", addr, "-points", strconv.Itoa(c.points), "-setpoints", "8")
		if cmd.Stderr, err = os.Create(log); err != nil {
			return nil, err
		}
		if err := ps.start(cmd); err != nil {
			return nil, err
		}
		if err := waitLog(log, "moving points", 10*time.Second); err != nil {
			return nil, fmt.Errorf("modbus-sim %d: %w", i+1, err)
		}
		addrs = append(addrs, addr)
	}
	return addrs, nil
}

// startOPCUAServer starts examples/opcua/server's server.js with points
// moving points on a free loopback port and returns its endpoint.
func startOPCUAServer(c config, work string, ps *procs, points int) (endpoint string, pid int, err error) {
	fmt.Fprintf(os.Stderr, "== one node-opcua server of %d points (server.js --points)\n", points)
	addr, err := freeAddr()
	if err != nil {
		return "", 0, err
	}
	_, port, _ := net.SplitHostPort(addr)
	log := filepath.Join(work, "opcua-server.log")
	cmd := exec.Command(c.node, "server.js", "--port", port, "--pki", filepath.Join(work, "pki"), "--points", strconv.Itoa(points),
		"--update-slices", strconv.Itoa(c.opcuaSlices))
	cmd.Dir = c.opcuaServer
	f, err := os.Create(log)
	if err != nil {
		return "", 0, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := ps.start(cmd); err != nil {
		return "", 0, err
	}
	if err := waitLog(log, "ready opc.tcp://", 3*time.Minute); err != nil {
		return "", 0, fmt.Errorf("OPC UA server: %w", err)
	}
	return "opc.tcp://127.0.0.1:" + port + "/physd", cmd.Process.Pid, nil
}

// daemon is a physd the run started.
type daemon struct {
	cmd     *exec.Cmd
	addr    string // its HTTP listener
	state   string // its state directory
	startup time.Duration
}

// startPhysd runs physd on site's manifest in dir (with MQTT to mqttURL,
// and pprof on ppAddr, when set) and waits until it is ready.
func startPhysd(c config, ps *procs, dir string, site scalesite.Site, mqttURL, ppAddr string) (*daemon, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	manifestPath := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(manifestPath, site.Manifest(), 0o600); err != nil {
		return nil, err
	}
	d := &daemon{state: filepath.Join(dir, "state")}
	args := []string{"run", "--manifest", manifestPath, "--state", d.state, "--http", "127.0.0.1:0"}
	if mqttURL != "" {
		args = append(args, "--mqtt-url", mqttURL)
	}
	args = append(args, strings.Fields(c.physdArgs)...)
	log := filepath.Join(dir, "physd.log")
	d.cmd = exec.Command(c.physd, args...)
	d.cmd.Env = os.Environ()
	if ppAddr != "" {
		d.cmd.Env = append(d.cmd.Env, "PHYSD_PPROF="+ppAddr)
	}
	if c.physdEnv != "" {
		d.cmd.Env = append(d.cmd.Env, strings.Fields(c.physdEnv)...)
	}
	var err error
	if d.cmd.Stderr, err = os.Create(log); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "== physd %s\n", strings.Join(args, " "))
	t0 := time.Now()
	if err := ps.start(d.cmd); err != nil {
		return nil, err
	}
	if err := waitLog(log, `"msg":"ready"`, 3*time.Minute); err != nil {
		return nil, fmt.Errorf("physd: %w (log %s)", err, log)
	}
	d.startup = time.Since(t0)
	if d.addr, err = logValue(log, `"msg":"listening"`, "addr"); err != nil {
		return nil, err
	}
	return d, nil
}

// stop ends the daemon (SIGTERM) and waits for it.
func (d *daemon) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	_ = d.cmd.Wait()
}

// waitMetric waits until the /metrics sample name (summed over labels)
// reaches want, and returns how long that took.
func waitMetric(hc *http.Client, url, name string, want float64, limit time.Duration) (time.Duration, error) {
	t0 := time.Now()
	for time.Since(t0) < limit {
		if m, err := scrape(hc, url); err == nil && m[name] >= want {
			return time.Since(t0), nil
		}
		time.Sleep(time.Second)
	}
	return 0, fmt.Errorf("%s did not reach %v within %v", name, want, limit)
}

// freeAddr is a loopback address with a port free now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// waitLog waits until the file holds want.
func waitLog(path, want string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), want) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(path)
	return fmt.Errorf("no %q within %v; log:\n%.2000s", want, limit, b)
}

// logValue returns field of the first JSON log line containing marker.
func logValue(path, marker, field string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if !strings.Contains(sc.Text(), marker) {
			continue
		}
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			if s, ok := m[field].(string); ok {
				return s, nil
			}
		}
	}
	return "", fmt.Errorf("%s: no %s line with %s", path, marker, field)
}

func startMosquitto(bin, work string, ps *procs) (string, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("-mqtt auto: %s not found (install mosquitto, or run without -mqtt)", bin)
	}
	addr, err := freeAddr()
	if err != nil {
		return "", err
	}
	host, port, _ := net.SplitHostPort(addr)
	conf := filepath.Join(work, "mosquitto.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "listener %s %s\nallow_anonymous true\npersistence false\n", port, host), 0o600); err != nil {
		return "", err
	}
	cmd := exec.Command(path, "-c", conf)
	if cmd.Stderr, err = os.Create(filepath.Join(work, "mosquitto.log")); err != nil {
		return "", err
	}
	if err := ps.start(cmd); err != nil {
		return "", err
	}
	for range 100 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return "tcp://" + addr, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", errors.New("mosquitto did not listen within 5 s")
}

// procCPU is the process's user+system CPU time in µs.
func procCPU(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return (ut + st) * 1e6 / 100 // USER_HZ
}

// kv reads "Key: N kB" lines of a /proc file into kB values.
func kv(path string) map[string]int64 {
	out := map[string]int64{}
	b, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) >= 1 {
			if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				out[strings.TrimSpace(k)] = n
			}
		}
	}
	return out
}

type status struct{ rssKB, hwmKB, threads int64 }

func readStatus(pid int) status {
	m := kv(fmt.Sprintf("/proc/%d/status", pid))
	return status{rssKB: m["VmRSS"], hwmKB: m["VmHWM"], threads: m["Threads"]}
}

type rollup struct{ rssKB, anonKB, fileKB int64 }

func readRollup(pid int) rollup {
	m := kv(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	return rollup{rssKB: m["Rss"], anonKB: m["Anonymous"], fileKB: m["Rss"] - m["Anonymous"]}
}

type rssStats struct {
	mu        sync.Mutex
	n         int
	sum, most int64 // kB
}

// sampleRSS samples VmRSS every second until the returned function runs.
func sampleRSS(pid int, s *rssStats) func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				kb := readStatus(pid).rssKB
				s.mu.Lock()
				s.n++
				s.sum += kb
				s.most = max(s.most, kb)
				s.mu.Unlock()
			}
		}
	}()
	return func() { close(stop); <-done }
}

// writeBytes is what the process has caused to be written to storage
// (/proc/PID/io write_bytes: the page cache's writeback and fsyncs, not
// writes to sockets).
func writeBytes(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "write_bytes: "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

var metricLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eE]+|NaN)$`)

// scrape sums /metrics samples by name (labels summed over).
func scrape(hc *http.Client, url string) (map[string]float64, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := metricLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err == nil {
			out[m[1]] += v
		}
	}
	return out, sc.Err()
}

type ageStats struct {
	ages           []float64 // ms
	uncached, bad  int
	errors         int
	first          string
	samples        int
	readLatencies  []float64 // ms, the resources/read round trip
	pointsSampled  map[string]bool
	readsPerSecond float64
}

// sampleAges reads the observation resource of a random read point every
// c.sampleEvery for d, and records each answer's age_ms: how old the
// point's newest value was when an agent read it. A cached answer's age is
// the time since the poll that read it; an answer older than the point's
// cache_ttl_ms (2 polls) would have made physd read the device then
// (cached: false), so those are counted apart: each is a poll that did not
// come round in time.
func sampleAges(hc *http.Client, endpoint string, c config, site scalesite.Site, d time.Duration) ageStats {
	s := ageStats{pointsSampled: map[string]bool{}}
	rng := rand.New(rand.NewPCG(1, 2))
	reads := site.Reads()
	t := time.NewTicker(c.sampleEvery)
	defer t.Stop()
	end := time.Now().Add(d)
	start := time.Now()
	var id int64
	for time.Now().Before(end) {
		<-t.C
		name := scalesite.PointName(rng.IntN(c.devices), rng.IntN(reads))
		id++
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t0 := time.Now()
		text, err := rawmcp.ReadResource(ctx, hc, endpoint, id, "physmcp://obs/"+name)
		cancel()
		s.samples++
		if err != nil {
			s.errors++
			if s.first == "" {
				s.first = err.Error()
			}
			continue
		}
		s.readLatencies = append(s.readLatencies, float64(time.Since(t0).Microseconds())/1000)
		var o struct {
			AgeMS   float64 `json:"age_ms"`
			Cached  bool    `json:"cached"`
			Quality string  `json:"quality"`
		}
		if err := json.Unmarshal([]byte(text), &o); err != nil {
			s.errors++
			continue
		}
		s.pointsSampled[name] = true
		if o.Quality != "good" {
			s.bad++
		}
		if !o.Cached {
			s.uncached++
		}
		s.ages = append(s.ages, o.AgeMS)
	}
	s.readsPerSecond = float64(s.samples) / time.Since(start).Seconds()
	return s
}

type doStats struct {
	lat           []float64 // ms
	errors        int
	first         string
	statuses      map[string]int
	callsPerSecon float64
}

// doCalls calls tool for d, a call every `every` (back to back for 0),
// each with a fresh idempotency key and a value 0 … 100.
func doCalls(hc *http.Client, endpoint, tool string, d, every time.Duration) doStats {
	s := doStats{statuses: map[string]int{}}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		if every > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
		}
		args := fmt.Appendf(nil, `{"value":%d,"idempotency_key":"scale-%s-%d"}`, (i*7)%101, run, i)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t0 := time.Now()
		sc, err := rawmcp.Call(ctx, hc, endpoint, int64(i+1), tool, args)
		el := float64(time.Since(t0).Microseconds()) / 1000
		cancel()
		if err != nil {
			s.errors++
			if s.first == "" {
				s.first = err.Error()
			}
			continue
		}
		var o rawmcp.Outcome
		_ = json.Unmarshal(sc, &o)
		s.statuses[o.Status]++
		if o.Status != "success" && s.first == "" {
			s.first = string(sc)
		}
		s.lat = append(s.lat, el)
	}
	s.callsPerSecon = float64(len(s.lat)) / time.Since(start).Seconds()
	return s
}

func saveProfiles(dir, addr string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	hc := &http.Client{Timeout: 2 * time.Minute}
	for name, path := range map[string]string{"cpu.pprof": "/debug/pprof/profile?seconds=30", "heap.pprof": "/debug/pprof/heap", "allocs.pprof": "/debug/pprof/allocs"} {
		resp, err := hc.Get("http://" + addr + path)
		if err != nil {
			return err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintln(os.Stderr, "profiles in", dir)
	return nil
}

// saveTrace saves a runtime execution trace of the running daemon.
func saveTrace(dir, addr string, d time.Duration) {
	hc := &http.Client{Timeout: d + time.Minute}
	resp, err := hc.Get(fmt.Sprintf("http://%s/debug/pprof/trace?seconds=%d", addr, int(d.Seconds())))
	if err != nil {
		fmt.Fprintln(os.Stderr, "trace:", err)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "trace.out"), b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "trace:", err)
	}
}

func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(i, 0)]
}

type report struct {
	c                    config
	site                 scalesite.Site
	mqtt                 bool
	startup              time.Duration
	subscribed           time.Duration // start → the OPC UA server held every monitored item
	rssAtReady, final    status
	rollup               rollup
	rss                  rssStats
	cpuShare, doCPUShare float64
	// The OPC UA server's own share of one core (-site opcua), in the
	// steady and do_ windows.
	deviceCPUShare, doDeviceCPUShare float64
	ages                             ageStats
	do, control                      doStats
	metrics0, metrics1               map[string]float64
	histBytes                        int64
	diskWrites                       float64 // bytes/s the process had written to storage in the steady window
	histWindow                       time.Duration
	historyFile                      int64
	load0, load1                     string
	elapsed                          time.Duration
}

func (r *report) delta(name string) float64 { return r.metrics1[name] - r.metrics0[name] }

func (r *report) markdown() string {
	c := r.c
	points := c.devices * c.points
	win := c.measure.Seconds()
	var b strings.Builder
	fmt.Fprintf(&b, "\n## %s\n\n", r.c.label)
	fmt.Fprintf(&b, "- %s; %d CPUs (%s); %s; code %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), cpuModel(), runtime.Version(), gitHead())
	devices := fmt.Sprintf("%d modbus-sim × %d, unit 1, int16 input registers 30101 … and 4 setpoints each", c.devices, c.points)
	if c.site == "opcua" {
		devices = fmt.Sprintf("one node-opcua server, server.js --points %d --update-slices %d: Double AnalogItems that all move every second, each a monitored item with a 0.5 %% deadband; 5 setpoints beside", points, c.opcuaSlices)
	}
	fmt.Fprintf(&b, "- %d points (%s), poll_ms %d, history %s, MQTT %s; settle %v, steady window %v, do_ window %v\n",
		points, devices, c.pollMS, map[bool]string{true: "on", false: "off"}[!strings.Contains(c.physdArgs, "--history-max-mb 0")],
		map[bool]string{true: "on (mosquitto on loopback)", false: "off"}[r.mqtt], c.settle, c.measure, c.do)
	if c.physdArgs != "" || c.physdEnv != "" {
		fmt.Fprintf(&b, "- physd run also with: %s %s\n", c.physdEnv, c.physdArgs)
	}
	fmt.Fprintf(&b, "- machine load (1/5/15-min loadavg) at start: %s, at end: %s; run took %v\n\n", r.load0, r.load1, r.elapsed.Round(time.Second))
	b.WriteString("| metric | value |\n| --- | --- |\n")
	row := func(k, f string, a ...any) { fmt.Fprintf(&b, "| %s | %s |\n", k, fmt.Sprintf(f, a...)) }
	row("start → ready", "%.1f s (RSS then %.1f MiB)", r.startup.Seconds(), mib(r.rssAtReady.rssKB))
	if c.site == "opcua" {
		row("start → every monitored item on the server", "%.1f s", r.subscribed.Seconds())
	}
	row("CPU, steady (share of one core)", "**%.1f %%**", 100*r.cpuShare)
	r.rss.mu.Lock()
	meanRSS := 0.0
	if r.rss.n > 0 {
		meanRSS = float64(r.rss.sum) / float64(r.rss.n)
	}
	row("RSS, steady: mean / max (VmRSS)", "**%.1f / %.1f MiB**", meanRSS/1024, mib(r.rss.most))
	r.rss.mu.Unlock()
	row("RSS at the end: anon / file (smaps_rollup); VmHWM", "%.1f / %.1f MiB; %.1f MiB", mib(r.rollup.anonKB), mib(r.rollup.fileKB), mib(r.final.hwmKB))
	row("Go heap in use; goroutines; threads", "%.1f MiB; %.0f; %d", r.metrics1["go_memstats_heap_inuse_bytes"]/(1<<20), r.metrics1["go_goroutines"], r.final.threads)
	row("allocation rate; collections", "%.1f MiB/s; %.1f/s", r.delta("go_memstats_alloc_bytes_total")/win/(1<<20), r.delta("go_gc_duration_seconds_count")/win)
	row("observation age an agent reads: p50 / p99 / max", "%.0f / **%.0f** / %.0f ms (%d reads of random points' physmcp://obs/, %.1f/s; %d distinct)",
		pct(r.ages.ages, .5), pct(r.ages.ages, .99), pct(r.ages.ages, 1), len(r.ages.ages), r.ages.readsPerSecond, len(r.ages.pointsSampled))
	row("… answers not from a poll (cached: false) / not good", "%d / %d", r.ages.uncached, r.ages.bad)
	row("resources/read round trip p50 / p99", "%.2f / %.2f ms", pct(r.ages.readLatencies, .5), pct(r.ages.readLatencies, .99))
	if c.site == "opcua" {
		row("monitored items (subscriptions); notifications / s; keep-alives; subscriptions lost", "%.0f (%.0f); %.0f; %.0f; %.0f", r.metrics1["physd_bus_monitored_items"], r.metrics1["physd_bus_subscriptions"],
			r.delta("physd_bus_notifications")/win, r.delta("physd_bus_keepalives"), r.delta("physd_bus_subscription_losses"))
	} else {
		polls := r.delta("physd_bus_requests")
		row("Modbus requests / s; point reads coalesced into them", "%.1f; %.0f %% (%.0f coalesced reads/s)", polls/win, 100*r.delta("physd_bus_coalesced_reads")/(r.delta("physd_bus_coalesced_reads")+polls), r.delta("physd_bus_coalesced_reads")/win)
	}
	row("observations dropped by a subscriber (window)", "%.0f", r.delta("physd_observations_dropped"))
	if r.mqtt {
		row("MQTT messages / s (dropped in the window)", "%.0f (%.0f)", r.delta("physd_mqtt_published")/win, r.delta("physd_mqtt_dropped"))
	}
	row("storage writes (/proc/PID/io write_bytes), steady", "%.0f MiB/day", r.diskWrites*86400/(1<<20))
	perDay := float64(r.histBytes) / r.histWindow.Seconds() * 86400
	row("history.db growth", "%.1f MiB in %v → %.0f MiB/day (%.0f bytes/point/day); file %.1f MiB at the end", mib(r.histBytes>>10), r.histWindow.Round(time.Second), perDay/(1<<20), perDay/float64(points), float64(r.historyFile)/(1<<20))
	pace := "one after another"
	if c.doEvery > 0 {
		pace = "one every " + c.doEvery.String()
	}
	row("do_ "+scalesite.SetpointTool(0)+", "+pace+": p50 / p99 / max", "%.1f / **%.1f** / %.1f ms (%d calls, %.1f/s, %s)", pct(r.do.lat, .5), pct(r.do.lat, .99), pct(r.do.lat, 1), len(r.do.lat), r.do.callsPerSecon, statusText(r.do.statuses))
	row("CPU during the do_ window", "%.1f %% of one core", 100*r.doCPUShare)
	if c.site == "opcua" {
		row("the OPC UA server's own CPU (node-opcua, one thread of JavaScript): steady / do_ window", "%.1f %% / %.1f %% of one core", 100*r.deviceCPUShare, 100*r.doDeviceCPUShare)
	}
	row("control: the same do_ calls on a site of 20 points, right after", "%.1f / %.1f / %.1f ms (%d calls, %s)", pct(r.control.lat, .5), pct(r.control.lat, .99), pct(r.control.lat, 1), len(r.control.lat), statusText(r.control.statuses))
	if r.do.errors+r.ages.errors > 0 {
		row("errors", "do_ %d (%s); sampler %d (%s)", r.do.errors, r.do.first, r.ages.errors, r.ages.first)
	}
	return b.String()
}

func statusText(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func mib(kb int64) float64 { return float64(kb) / 1024 }

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func gitHead() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}
