package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// siteManifest is gateway i of a site of size gateways on 127.0.0.(10+i):
// a simulated zone with a temperature sensor and a fan.
func siteManifest(t testing.TB, dir string, i, size, maxPeers int) string {
	t.Helper()
	zone := fmt.Sprintf("zone_%02d", i)
	var seeds []string
	for j := 1; j <= size; j++ {
		seeds = append(seeds, fmt.Sprintf("gw_%02d/127.0.0.%d:7946", j, 10+j))
	}
	src := fmt.Sprintf(`physmcp_version: "0.1"
device: {id: gw_%02d, type: greenhouse_controller, location: {zone: %[2]s}}
network:
  protocols: [{type: ip}]
  mesh: {enabled: true, bind: 127.0.0.%[3]d, port: 7946, label: scale_site, seed_peers: [%[4]s], expected_size: %[5]d, max_peers: %[6]d, request_timeout_ms: 500}
buses: {plant: {type: sim, zones: {%[2]s: {}}}}
capabilities:
  - {name: temperature_%[2]s, kind: read, description: Air temperature., zone: %[2]s, binding: {type: sim, bus: plant, point: %[2]s.temperature}, data_type: float, unit: celsius, semantic_tags: [temperature, air, %[2]s]}
  - {name: fan_%[2]s, kind: do, description: Fan speed., zone: %[2]s, binding: {type: sim, bus: plant, point: %[2]s.fan}, data_type: int, unit: percent, range: {min: 0, max: 100}, semantic_tags: [fan, ventilation, cooling, %[2]s]}
`, i, zone, 10+i, strings.Join(seeds, ", "), size, maxPeers)
	p := filepath.Join(dir, fmt.Sprintf("gw_%02d.yml", i))
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// startSite runs size gateway processes and returns them once gw_01 sees
// every catalog.
// With ratePolicy, every gateway runs a policy that limits its fan to
// 30 do_ calls a minute (and allows it in the gate).
func startSite(t *testing.T, size, maxPeers int, ratePolicy bool) ([]*daemon, *mcp.ClientSession) {
	t.Helper()
	dir := t.TempDir()
	var ds []*daemon
	for i := 1; i <= size; i++ {
		state := filepath.Join(dir, fmt.Sprintf("state_%02d", i))
		args := []string{"run", "--manifest", siteManifest(t, dir, i, size, maxPeers), "--state", state,
			"--http", fmt.Sprintf("127.0.0.%d:0", 10+i), "--sim-control"}
		if ratePolicy {
			pol := filepath.Join(dir, fmt.Sprintf("gw_%02d.policy.yml", i))
			quorum := ""
			if i == 1 { // gw_01's fan needs every gateway of the site
				quorum = fmt.Sprintf("\n      - {type: quorum, min_peers: %d}", size)
			}
			src := fmt.Sprintf("physmcp_policy_version: \"0.1\"\ncapabilities:\n  do_fan_zone_%02d:\n    rules:\n      - {type: rate, max: \"30/min\"}%s\ngate:\n  l0:\n    allow:\n      - {name: fans, tool: \"do_fan_*\"}\n", i, quorum)
			if err := os.WriteFile(pol, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			args = append(args, "--policy", pol)
		}
		d := &daemon{cmd: exec.Command(physdBin, args...), state: state, stderr: &syncBuffer{}, done: make(chan error, 1)}
		d.cmd.Stderr = d.stderr
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { d.done <- d.cmd.Wait() }()
		ds = append(ds, d)
	}
	t.Cleanup(func() { // all at once: each leaves the mesh gracefully
		var wg sync.WaitGroup
		for _, d := range ds {
			wg.Go(func() { _ = d.cmd.Process.Signal(syscall.SIGCONT); d.stop(t) })
		}
		wg.Wait()
	})
	began := time.Now()
	for _, d := range ds {
		d.addr = d.stderr.logValue(t, "listening", "addr")
		d.stderr.logValue(t, "mesh joined", "node")
	}
	t.Logf("%d gateways up after %v", size, time.Since(began).Round(time.Millisecond))
	cs := connectHTTP(t, ds[0], "2026-07-28")
	// Usually seconds; one run in three here took 63 s (why is not yet
	// known): the tests below are of the silent owner, this only waits
	// for the site.
	deadline := time.Now().Add(120 * time.Second)
	for len(listRemote(t, cs)) < 2*(size-1) {
		if time.Now().After(deadline) {
			t.Fatalf("gw_01 lists %d remote tools of %d", len(listRemote(t, cs)), 2*(size-1))
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("gw_01 lists every remote tool after %v", time.Since(began).Round(time.Millisecond))
	return ds, cs
}

func listRemote(t *testing.T, cs *mcp.ClientSession) []string {
	var out []string
	for name := range listTools(t, cs) {
		if strings.HasSuffix(name, "zone_01") || !strings.Contains(name, "zone_") {
			continue
		}
		out = append(out, name)
	}
	return out
}

// TestMeshTwelveGatewaysSilentOwner: 12 real gateway processes on loopback
// addresses, max_peers 4, each with a rate rule on its fan (gw_01's also
// needs a quorum of all 12). A can_do
// matching all 12 is complete and carries the owners' rate_limit; a gateway
// frozen with SIGSTOP (accepts connections, answers nothing) makes routed
// calls fail within request_timeout_ms + a small margin naming it, its fan
// is reported blocked, and once resumed it has not executed the do_ that
// waited in its socket buffer.
func TestMeshTwelveGatewaysSilentOwner(t *testing.T) {
	const size, margin = 12, 150 * time.Millisecond
	ds, cs := startSite(t, size, 4, true)
	var rep map[string]any
	deadline := time.Now().Add(30 * time.Second)
	for {
		rep = canDo(t, cs, "ventilation")
		if len(sources(rep, "candidates")) == size || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	md := rep["metadata"].(map[string]any)
	if len(sources(rep, "candidates")) != size || len(sources(rep, "blocked")) != 0 || md["peers_matched"] != float64(size-1) ||
		md["peers_consulted"] != float64(size-1) || md["responses_received"] != float64(size-1) || md["fanout_used"].(float64) > 4 || md["ttl_used"] != 1.0 {
		t.Fatalf("can_do over %d gateways: candidates %v, blocked %v, metadata %v", size, sources(rep, "candidates"), sources(rep, "blocked"), md)
	}

	// The owner's rate rule shows on its candidate, across the mesh.
	for _, x := range rep["candidates"].([]any) {
		c := x.(map[string]any)
		if c["capability"] != "do_fan_zone_05" {
			continue
		}
		if rl, _ := c["rate_limit"].(map[string]any); rl["max"] != 30.0 || rl["current_window_remaining"] != 30.0 {
			t.Errorf("gw_05's fan candidate rate_limit = %v, want max 30, 30 remaining", c["rate_limit"])
		}
	}

	victim := ds[4] // gw_05
	if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"read_temperature_zone_05", map[string]any{"source": "gw_05"}},
		{"do_fan_zone_05", map[string]any{"source": "gw_05", "value": 70, "idempotency_key": "stopped-1"}},
	} {
		start := time.Now()
		res := call(t, cs, c.tool, c.args)
		took := time.Since(start)
		if !res.IsError || !strings.Contains(text(res), "gw_05") || took > 500*time.Millisecond+margin ||
			(strings.HasPrefix(c.tool, "do_") && !strings.Contains(text(res), "nothing was done")) {
			t.Errorf("%s to a SIGSTOPped owner after %v: isError %v %s", c.tool, took, res.IsError, text(res))
		}
		t.Logf("REPORT %s to a SIGSTOPped owner failed after %v: %s", c.tool, took.Round(time.Millisecond), text(res))
	}
	start := time.Now()
	rep = canDo(t, cs, "ventilation")
	took := time.Since(start)
	if got := sources(rep, "blocked")["do_fan_zone_05"]; got != "gw_05/source_unreachable" || sources(rep, "blocked")["do_fan_zone_01"] != "gw_01/partition_no_quorum" ||
		len(sources(rep, "candidates")) != size-2 || took > 500*time.Millisecond+margin {
		t.Errorf("can_do with gw_05 stopped, after %v: blocked %v, %d candidates", took, sources(rep, "blocked"), len(sources(rep, "candidates")))
	}
	t.Logf("REPORT can_do with one of %d gateways SIGSTOPped: %v", size, took.Round(time.Millisecond))

	// gw_01's own fan needs a quorum of all 12: with gw_05 silent the
	// refusal reaches the client within request_timeout_ms.
	start = time.Now()
	r0 := structured(t, call(t, cs, "do_fan_zone_01", map[string]any{"value": 50, "idempotency_key": "quorum-1"}))
	took = time.Since(start)
	// Decided 50 ms before the deadline; the margin here absorbs a loaded
	// test machine's audit fsync (the synctest test asserts the decision).
	if r0["status"] != "failed" || r0["permission"] != "partition_no_quorum" || took > 500*time.Millisecond+margin {
		t.Errorf("quorum-guarded do_ with gw_05 silent, after %v: %v", took, r0)
	}
	t.Logf("REPORT partition_no_quorum refusal (11 of 12) reached the client after %v", took.Round(time.Millisecond))

	if err := victim.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // it reads what waited in its buffers
	if w := victim.sim(t).writes("zone_05.fan"); w != 0 {
		t.Errorf("gw_05 executed %d stale fan writes after SIGCONT", w)
	}
	r := structured(t, call(t, cs, "do_fan_zone_05", map[string]any{"source": "gw_05", "value": 30, "idempotency_key": "resumed-1"}))
	if r["status"] != "success" || r["applied_value"] != 30.0 {
		t.Errorf("routed do_ after SIGCONT: %v", r)
	}
}

// TestMeshCanDoBench measures distributed can_do over real processes at
// the sizes in PHYSD_MESH_BENCH (e.g. "3,10,30"); bench/mesh_cando.sh runs
// it. Every answer must be complete.
func TestMeshCanDoBench(t *testing.T) {
	sizes := os.Getenv("PHYSD_MESH_BENCH")
	if sizes == "" {
		t.Skip("set PHYSD_MESH_BENCH=3,10,30 (bench/mesh_cando.sh)")
	}
	n, _ := strconv.Atoi(os.Getenv("PHYSD_MESH_BENCH_N"))
	if n <= 0 {
		n = 300
	}
	for _, s := range strings.Split(sizes, ",") {
		size, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || size < 2 || size > 200 {
			t.Fatalf("PHYSD_MESH_BENCH: bad size %q", s)
		}
		maxPeers, _ := strconv.Atoi(os.Getenv("PHYSD_MESH_BENCH_MAX_PEERS"))
		if maxPeers <= 0 {
			maxPeers = 10
		}
		t.Run(fmt.Sprintf("gateways=%d", size), func(t *testing.T) {
			_, cs := startSite(t, size, maxPeers, false)
			for start := time.Now(); len(sources(canDo(t, cs, "ventilation"), "candidates")) != size; time.Sleep(250 * time.Millisecond) {
				if time.Since(start) > 60*time.Second {
					t.Fatal("can_do never complete")
				}
			}
			lat := make([]time.Duration, 0, n)
			for range n {
				start := time.Now()
				rep := canDo(t, cs, "ventilation")
				lat = append(lat, time.Since(start))
				if c := len(sources(rep, "candidates")); c != size {
					t.Fatalf("incomplete can_do: %d candidates of %d, blocked %v", c, size, sources(rep, "blocked"))
				}
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			p := func(q float64) time.Duration { return percentile(lat, q, 100*time.Microsecond) }
			t.Logf("REPORT distributed can_do over %d real gateway processes (max_peers %d), %d calls: p50 %v, p99 %v, max %v",
				size, maxPeers, n, p(0.50), p(0.99), lat[len(lat)-1].Round(100*time.Microsecond))
		})
	}
}
