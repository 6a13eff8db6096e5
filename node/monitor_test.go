package node_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// pushed is a fake device that pushes its changes (drivers.Monitorer), as
// an OPC UA server does for a monitored item, and can also be read.
type pushed struct {
	mu       sync.Mutex
	value    float64 // what a device read returns
	readErr  error
	reads    int
	monitors map[string]*pushMonitor // the latest monitor, by capability
	started  map[string]int
	stopped  map[string]int
}

var push = &pushed{}

func (p *pushed) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.value, p.readErr, p.reads = 10, nil, 0
	p.monitors, p.started, p.stopped = map[string]*pushMonitor{}, map[string]int{}, map[string]int{}
}

func (p *pushed) count() (reads int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reads
}

func (p *pushed) monitor(name string) *pushMonitor {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.monitors[name]
}

func (p *pushed) calls(name string) (started, stopped int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started[name], p.stopped[name]
}

func init() {
	push.reset()
	drivers.Register("pushed", func(context.Context, *manifest.Bus) (drivers.Bus, error) { return pushBus{}, nil })
}

type pushBus struct{}

func (pushBus) Point(c *manifest.Capability) (drivers.Point, error) {
	return pushPoint{name: c.Name}, nil
}
func (pushBus) Health() error { return nil }
func (pushBus) Close() error  { return nil }

type pushPoint struct{ name string }

func (pushPoint) Read(context.Context) (drivers.Reading, error) {
	push.mu.Lock()
	defer push.mu.Unlock()
	push.reads++
	if push.readErr != nil {
		return drivers.Reading{}, push.readErr
	}
	return drivers.Reading{Value: push.value}, nil
}

func (pushPoint) Write(_ context.Context, v any) error {
	push.mu.Lock()
	defer push.mu.Unlock()
	push.value, _ = v.(float64)
	return nil
}

func (p pushPoint) Monitor(req drivers.MonitorRequest, deliver func(drivers.Update)) (drivers.Monitor, error) {
	m := &pushMonitor{name: p.name, req: req, deliver: deliver}
	push.mu.Lock()
	defer push.mu.Unlock()
	push.monitors[p.name] = m
	push.started[p.name]++
	return m, nil
}

// pushMonitor is one monitored item of the fake device; the test plays
// its driver: it pushes values, keep-alives and losses.
type pushMonitor struct {
	name    string
	req     drivers.MonitorRequest
	deliver func(drivers.Update)

	mu      sync.Mutex
	seq     uint64
	vouched uint64
	asOf    time.Time
}

func (m *pushMonitor) Confirmed() (uint64, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.vouched, m.asOf
}

func (m *pushMonitor) Stop() {
	push.mu.Lock()
	defer push.mu.Unlock()
	push.stopped[m.name]++
}

// send pushes a value the device vouches for.
func (m *pushMonitor) send(v float64) {
	m.mu.Lock()
	m.seq++
	m.vouched, m.asOf = m.seq, time.Now()
	u := drivers.Update{Seq: m.seq, Reading: drivers.Reading{Value: v, At: time.Now()}}
	m.mu.Unlock()
	m.deliver(u)
}

// keepAlive: the device confirms the last value now.
func (m *pushMonitor) keepAlive() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.asOf = time.Now()
}

// lose: the subscription is lost, and the driver says so.
func (m *pushMonitor) lose(err error) {
	m.mu.Lock()
	m.seq++
	m.vouched = 0
	u := drivers.Update{Seq: m.seq, Err: err}
	m.mu.Unlock()
	m.deliver(u)
}

// giveUp: the device refused to monitor the point, and the driver says so.
func (m *pushMonitor) giveUp() {
	m.mu.Lock()
	m.seq++
	m.vouched = 0
	u := drivers.Update{Seq: m.seq, Err: fmt.Errorf("filter refused: %w", drivers.ErrNotMonitored)}
	m.mu.Unlock()
	m.deliver(u)
}

// silence: the driver stops vouching without saying why (its keep-alive
// deadline passed, its own goroutine did not notice).
func (m *pushMonitor) silence() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.vouched = 0
}

const pushedManifest = `physmcp_version: "0.1"
device: {id: pushed_node, type: test, location: {zone: lab}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  dev: {type: pushed}
capabilities:
  - name: level
    kind: read
    description: A level the device pushes.
    binding: {type: virtual, bus: dev, address: level}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    timeout_ms: 1000
    poll_ms: 1000
    deadband: 2
    semantic_tags: [level]
  - name: flow
    kind: read
    description: A flow read on demand.
    binding: {type: virtual, bus: dev, address: flow}
    data_type: float
    timeout_ms: 1000
    semantic_tags: [flow]
`

func openPushed(t *testing.T, text string) *node.Node {
	t.Helper()
	push.reset()
	m, err := manifest.Parse("pushed.yml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return testrig.OpenManifest(t, m, "", nil).Node
}

// startPushed opens pushedManifest in a synctest bubble and returns the
// monitor of read_level once the node has asked for it.
func startPushed(t *testing.T) (*node.Node, *pushMonitor) {
	t.Helper()
	n := openPushed(t, pushedManifest)
	synctest.Wait()
	return n, push.monitor("level")
}

func readNow(t *testing.T, n *node.Node, tool string, maxAge time.Duration) promcp.Observation {
	t.Helper()
	o, err := n.Read(context.Background(), tool, maxAge)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// observed returns the observations of name waiting on sub.
func observed(sub *node.Subscription, name string) []node.Observed {
	var out []node.Observed
	for {
		select {
		case o := <-sub.C:
			if o.Cap.Name == name {
				out = append(out, o)
			}
		default:
			return out
		}
	}
}

// TestMonitoredCapability: a capability with poll_ms whose device pushes
// its changes is monitored, never polled; each push is recorded as a
// device read is (cache, stream with Changed); read_ serves the value
// while the device vouches for it, with the confirmation's time, and
// reads the device when the caller needs fresher than that; the
// confirmations are recorded every poll_ms (Changed false) and keep the
// liveness mark coming round.
func TestMonitoredCapability(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, m := startPushed(t)
		if m == nil || m.req.Interval != time.Second || m.req.Deadband == nil || m.req.Deadband.Value != 2 {
			t.Fatalf("monitor %+v: want level monitored every 1 s with deadband 2", m)
		}
		if push.monitor("flow") != nil {
			t.Fatal("flow has no poll_ms and is monitored")
		}
		sub := n.Subscribe(0)
		defer sub.Close()

		// Nothing pushed yet: read_ reads the device.
		if o := readNow(t, n, "read_level", -1); o.Value != 10.0 || o.Quality != promcp.QualityGood || o.Cached {
			t.Fatalf("before the first push: %+v, want a device read of 10", o)
		}
		reads := push.count()
		drain(sub)

		m.send(40)
		obs := observed(sub, "level")
		if len(obs) != 1 || !obs[0].Changed || obs[0].Obs.Value != 40.0 || obs[0].Obs.Quality != promcp.QualityGood {
			t.Fatalf("the push on the stream: %+v", obs)
		}
		o := readNow(t, n, "read_level", -1)
		if o.Value != 40.0 || o.Quality != promcp.QualityGood || !o.Cached {
			t.Fatalf("read_ after the push: %+v, want 40 good from the subscription", o)
		}

		// The value stays inside its deadband: nothing is pushed, the
		// device vouches for it every second (half-way between the polls
		// rounds, which come every second from the start).
		time.Sleep(500 * time.Millisecond)
		for range 5 {
			m.keepAlive()
			time.Sleep(time.Second)
		}
		synctest.Wait()
		obs = observed(sub, "level")
		if len(obs) != 5 {
			t.Fatalf("%d observations in 5 s of confirmations, want one a poll round", len(obs))
		}
		for _, o := range obs {
			if o.Changed || o.Obs.Value != 40.0 || o.Obs.Quality != promcp.QualityGood {
				t.Fatalf("a confirmation %+v, want 40 good unchanged", o)
			}
		}
		if got := push.count(); got != reads {
			t.Fatalf("%d device reads in 5 s: a monitored capability was polled", got-reads)
		}
		if err := n.Alive(); err != nil {
			t.Fatalf("Alive with the confirmations coming round: %v", err)
		}
		o = readNow(t, n, "read_level", -1)
		if o.Value != 40.0 || !o.Cached || o.AgeMS != 1000 {
			t.Fatalf("read_ 5.5 s after the push: %+v, want 40 as of the last keep-alive, 1 s ago", o)
		}

		// A caller that needs fresher than the subscription vouches for
		// (confirmed 1 s ago).
		time.Sleep(800 * time.Millisecond)
		if o := readNow(t, n, "read_level", 500*time.Millisecond); o.Value != 10.0 || o.Cached {
			t.Fatalf("max_age 500 ms, confirmed 800 ms ago: %+v, want a device read", o)
		}
		if o := readNow(t, n, "read_level", 0); o.Cached {
			t.Fatalf("max_age 0: %+v, want a device read", o)
		}
		if got := push.count(); got != reads+2 {
			t.Fatalf("%d device reads, want 2", got-reads)
		}
		for _, c := range n.Capabilities() {
			if (c.Tool == "read_level") != c.Monitored {
				t.Fatalf("status %+v: only read_level is monitored", c)
			}
		}
	})
}

// TestMonitoredLoss: once the subscription is lost, the value from
// before is never served as good (not from the cache either): read_ reads
// the device; the first good value after is the next push. A driver that
// stops vouching without saying so is caught by the next poll round.
func TestMonitoredLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, m := startPushed(t)
		sub := n.Subscribe(0)
		defer sub.Close()
		m.send(40)
		push.mu.Lock()
		push.readErr = fmt.Errorf("no session: %w", drivers.ErrOffline)
		push.mu.Unlock()

		m.lose(fmt.Errorf("subscription lost: %w", drivers.ErrOffline))
		obs := observed(sub, "level")
		if len(obs) != 2 || obs[1].Obs.Quality == promcp.QualityGood || !obs[1].Changed {
			t.Fatalf("the loss on the stream: %+v, want a change away from good", obs)
		}
		// Within cache_ttl_ms of the push, and still not good.
		o := readNow(t, n, "read_level", -1)
		if o.Quality == promcp.QualityGood || o.Cached || !strings.Contains(o.Reason, "no session") {
			t.Fatalf("read_ after the loss: %+v, want a failed device read, not the cached value", o)
		}
		time.Sleep(3 * time.Second)
		if o := readNow(t, n, "read_level", -1); o.Quality == promcp.QualityGood {
			t.Fatalf("read_ 3 s after the loss: %+v", o)
		}

		m.send(55)
		if o := readNow(t, n, "read_level", -1); o.Value != 55.0 || o.Quality != promcp.QualityGood {
			t.Fatalf("after the next push: %+v", o)
		}
		drain(sub)

		m.silence()
		if o := readNow(t, n, "read_level", -1); o.Quality == promcp.QualityGood {
			t.Fatalf("read_ once the driver stopped vouching: %+v", o)
		}
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		// The poll round records that the value is no longer vouched for
		// (before or after the read_'s failed device read: both run at the
		// same instant of the bubble's clock).
		said := false
		for _, o := range observed(sub, "level") {
			if o.Obs.Quality == promcp.QualityGood {
				t.Fatalf("an observation after the driver stopped vouching: %+v", o)
			}
			said = said || strings.Contains(o.Obs.Reason, "no longer confirms")
		}
		if !said {
			t.Fatal("the poll round after the driver stopped vouching did not say the value is no longer confirmed")
		}
	})
}

// TestMonitorGivesUp: a monitor that gives up (the device refused the
// filter) makes the node poll the capability every poll_ms.
func TestMonitorGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, m := startPushed(t)
		m.giveUp()
		reads := push.count()
		time.Sleep(3500 * time.Millisecond)
		synctest.Wait()
		if got := push.count() - reads; got != 3 {
			t.Fatalf("%d device reads in 3.5 s after the monitor gave up, want 3 (poll_ms 1000)", got)
		}
		if o := readNow(t, n, "read_level", -1); o.Value != 10.0 || o.Quality != promcp.QualityGood {
			t.Fatalf("read_: %+v", o)
		}
		for _, c := range n.Capabilities() {
			if c.Monitored {
				t.Fatalf("status %+v: polled, not monitored", c)
			}
		}
	})
}

// TestMonitorReload: a reload that keeps a capability keeps its monitor
// (the device keeps its item); one that redefines it stops the monitor
// and starts another; one that removes it stops it; Close stops them.
func TestMonitorReload(t *testing.T) {
	n := openPushed(t, pushedManifest)
	reload := func(text string) {
		t.Helper()
		m, err := manifest.Parse("pushed.yml", []byte(text))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.Reload(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	want := func(started, stopped int) {
		t.Helper()
		if a, b := push.calls("level"); a != started || b != stopped {
			t.Fatalf("level monitors started %d, stopped %d; want %d, %d", a, b, started, stopped)
		}
	}
	want(1, 0)
	reload(strings.Replace(pushedManifest, "A flow read on demand.", "The flow, read on demand.", 1))
	want(1, 0)
	reload(strings.Replace(pushedManifest, "deadband: 2", "deadband: 5", 1))
	want(2, 1)
	if d := push.monitor("level").req.Deadband; d == nil || d.Value != 5 {
		t.Fatalf("the redefined monitor's deadband %+v", d)
	}
	i := strings.Index(pushedManifest, "  - name: level")
	j := strings.Index(pushedManifest, "  - name: flow")
	reload(pushedManifest[:i] + pushedManifest[j:])
	want(2, 2)
	reload(pushedManifest)
	want(3, 2)
	if err := n.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	want(3, 3)
}

// TestMonitorsShareARound: the monitors of one bus and interval come round
// together — each confirmed every poll_ms, one that gave up polled beside
// the others still confirmed — and a reload that removes one of them
// stops it alone: the others keep coming round, and nothing more is
// recorded for the removed one.
func TestMonitorsShareARound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		second := strings.Replace(pushedManifest[strings.Index(pushedManifest, "  - name: level"):strings.Index(pushedManifest, "  - name: flow")],
			"name: level", "name: tank", 1)
		second = strings.Replace(second, "address: level", "address: tank", 1)
		text := pushedManifest + second
		n := openPushed(t, text)
		synctest.Wait()
		level, tank := push.monitor("level"), push.monitor("tank")
		if level == nil || tank == nil {
			t.Fatal("level and tank are not both monitored")
		}
		sub := n.Subscribe(0)
		defer sub.Close()
		level.send(40)
		tank.send(60)
		drain(sub)

		// level gives up: it is polled every second; tank is still
		// confirmed every second, in the same rounds.
		level.giveUp()
		reads := push.count()
		time.Sleep(500 * time.Millisecond)
		for range 3 {
			tank.keepAlive()
			time.Sleep(time.Second)
		}
		synctest.Wait()
		if got := push.count() - reads; got != 3 {
			t.Fatalf("%d device reads of level in 3.5 s after it gave up, want 3", got)
		}
		if obs := observed(sub, "tank"); len(obs) != 3 {
			t.Fatalf("%d observations of tank in 3 s of confirmations, want 3", len(obs))
		}

		// A reload without tank stops its monitor; level is still polled.
		m, err := manifest.Parse("pushed.yml", []byte(pushedManifest))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.Reload(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		if started, stopped := push.calls("tank"); started != 1 || stopped != 1 {
			t.Fatalf("tank monitors started %d, stopped %d after the reload that removed it", started, stopped)
		}
		drain(sub)
		reads = push.count()
		for range 3 {
			tank.keepAlive()
			time.Sleep(time.Second)
		}
		synctest.Wait()
		if obs := observed(sub, "tank"); len(obs) != 0 {
			t.Fatalf("%d observations of tank after the reload that removed it", len(obs))
		}
		if got := push.count() - reads; got != 3 {
			t.Fatalf("%d device reads of level in 3 s after the reload, want 3", got)
		}
		if err := n.Alive(); err != nil {
			t.Fatalf("Alive: %v", err)
		}
	})
}
