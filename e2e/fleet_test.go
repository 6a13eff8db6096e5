package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/fleet"
	"github.com/physd/physd/internal/natstest"
)

const fleetStream = "PHYSD_AUDIT"

// fleetStreams are the streams a site's user reads its cursors from.
var fleetStreams = []string{fleetStream, "PHYSD_HISTORY", "PHYSD_ALARMS"}

// fleetManifest is the greenhouse with a network.fleet block: site, the
// user and its password file, the hub's URL.
func fleetManifest(t *testing.T, url, site, user, password string) string {
	t.Helper()
	return fleetManifestWith(t, url, site, user, password, "")
}

// fleetManifestWith is fleetManifest with more network.fleet keys (YAML
// lines indented by four spaces).
func fleetManifestWith(t *testing.T, url, site, user, password, extra string) string {
	t.Helper()
	dir := t.TempDir()
	pw := filepath.Join(dir, "fleet.pw")
	if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	block := fmt.Sprintf("  fleet:\n    urls: [%q]\n    site: %s\n    user: %s\n    password_file: %s\n    connect_timeout_ms: 1000\n    publish_timeout_ms: 2000\n", url, site, user, pw) + extra
	s := strings.Replace(string(b), "  mesh:\n    enabled: false\n", "  mesh:\n    enabled: false\n"+block, 1)
	if s == string(b) {
		t.Fatal("the greenhouse manifest's network block moved")
	}
	s = strings.ReplaceAll(s, "$schema=../../schemas/", "$schema="+repoPath("schemas")+"/")
	path := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// hubAdmin is the hub operator's JetStream client; it creates the stream
// the sites publish to (the sites' users may not).
func hubAdmin(t *testing.T, h *natstest.Hub, create bool) jetstream.JetStream {
	t.Helper()
	_, js := natstest.Connect(t, h.URL())
	if create {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, cfg := range []jetstream.StreamConfig{
			{Name: fleetStream, Subjects: fleet.StreamSubjects("physd"), Duplicates: time.Minute, AllowDirect: true, AllowAtomicPublish: true},
			{Name: "PHYSD_HISTORY", Subjects: fleet.HistorySubjects("physd"), Duplicates: time.Minute, AllowDirect: true, AllowAtomicPublish: true},
			{Name: "PHYSD_ALARMS", Subjects: fleet.AlarmSubjects("physd"), MaxMsgsPerSubject: 1, AllowDirect: true},
		} {
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
		}
	}
	return js
}

// hubRecords is what the stream holds under subject: audit seq -> line,
// and the audit seqs held more than once.
func hubRecords(t *testing.T, js jetstream.JetStream, subject string) (map[uint64]string, []uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, fleetStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, dups := map[uint64]string{}, []uint64(nil)
	if info.State.Msgs == 0 {
		return out, nil
	}
	for s := info.State.FirstSeq; s <= info.State.LastSeq; s++ {
		m, err := st.GetMsg(ctx, s)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != subject {
			continue
		}
		var r struct {
			Seq uint64 `json:"seq"`
		}
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatalf("stream seq %d: %v", s, err)
		}
		if h := m.Header.Get(fleet.HeaderSeq); h != strconv.FormatUint(r.Seq, 10) {
			t.Errorf("audit seq %d carries %s %q", r.Seq, fleet.HeaderSeq, h)
		}
		if _, ok := out[r.Seq]; ok {
			dups = append(dups, r.Seq)
		}
		out[r.Seq] = string(m.Data)
	}
	return out, dups
}

// hubCount is the number of messages the stream holds.
func hubCount(js jetstream.JetStream) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := js.Stream(ctx, fleetStream)
	if err != nil {
		return 0
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// localAudit is the gateway's audit trail as its files hold it (rotated
// files first): seq -> line.
func localAudit(t *testing.T, state string) map[uint64]string {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(state, "audit", "audit-*.jsonl"))
	sort.Strings(names)
	names = append(names, filepath.Join(state, "audit", "audit.jsonl"))
	out := map[uint64]string{}
	for _, name := range names {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var r struct {
				Seq uint64 `json:"seq"`
			}
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				out[r.Seq] = sc.Text()
			}
		}
		f.Close()
	}
	return out
}

// sameTrail fails unless the stream holds every local record exactly once,
// byte for byte, and nothing else.
func sameTrail(t *testing.T, js jetstream.JetStream, subject, state string) map[uint64]string {
	t.Helper()
	got, dups := hubRecords(t, js, subject)
	want := localAudit(t, state)
	if len(dups) > 0 {
		t.Errorf("audit seqs in the stream twice: %v", dups)
	}
	for s, line := range want {
		if got[s] != line {
			t.Errorf("audit seq %d: the stream holds %q, the local audit %q", s, got[s], line)
		}
	}
	for s := range got {
		if _, ok := want[s]; !ok {
			t.Errorf("the stream holds audit seq %d, the local audit does not", s)
		}
	}
	t.Logf("%d audit records, locally and in the stream, exactly once", len(want))
	return got
}

// waitSynced waits until the stream holds as many records of subject as
// the local audit has.
func waitSynced(t *testing.T, js jetstream.JetStream, state string, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		n := uint64(len(localAudit(t, state)))
		if c := hubCount(js); c >= n && n > 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("the stream holds %d records, the local audit %d, after %s", hubCount(js), n, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fleetStatus is /status's fleet entry.
func fleetStatus(t *testing.T, d *daemon) map[string]any {
	t.Helper()
	code, b := d.request(t, http.MethodGet, "/status", "")
	if code != 200 {
		t.Fatalf("/status: %d %s", code, b)
	}
	var st struct {
		Fleet map[string]any `json:"fleet"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st.Fleet
}

// doCalls sends n do_ calls (keys prefix-0000…) and returns the keys
// acknowledged.
func doCalls(t *testing.T, cs *mcp.ClientSession, prefix string, n int) []string {
	t.Helper()
	var keys []string
	for i := range n {
		key := fmt.Sprintf("%s-%04d", prefix, i)
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_vent_zone_c", Arguments: map[string]any{"value": 10 + i%80, "idempotency_key": key}})
		if err != nil || res.IsError {
			t.Fatalf("do_vent_zone_c %s: %v %v", key, err, res)
		}
		keys = append(keys, key)
	}
	return keys
}

// doResultsOnce fails unless every key's do record is in the stream once.
func doResultsOnce(t *testing.T, records map[uint64]string, keys []string) {
	t.Helper()
	count := map[string]int{}
	for _, line := range records {
		var r struct {
			Event string `json:"event"`
			Key   string `json:"idempotency_key"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && r.Event == "do" {
			count[r.Key]++
		}
	}
	for _, k := range keys {
		if count[k] != 1 {
			t.Errorf("do_ result %s is in the stream %d times", k, count[k])
		}
	}
}

// slowProxy forwards TCP to the hub, delaying each chunk from the hub by
// delay (a slow WAN): a replay then takes long enough to be killed in.
// Armed, it watches the hub's bytes to the site for a do_'s go-ahead and
// from then on drops everything the site sends, until heal: the answer to
// that go-ahead is lost on the way (a WAN cut at the worst moment) while
// the site runs the actuation.
type slowProxy struct {
	l     net.Listener
	delay atomic.Int64
	armed atomic.Bool
	drop  atomic.Bool
	seen  chan struct{}
	mu    sync.Mutex
	conns []net.Conn
}

func startSlowProxy(t *testing.T, target string) *slowProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &slowProxy{l: l, seen: make(chan struct{}, 1)}
	t.Cleanup(func() { l.Close(); p.heal() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go p.pipe(c, up, false)
			go p.pipe(up, c, true)
		}
	}()
	return p
}

// pipe copies one direction: toward the site delayed (and watched when
// armed), toward the hub dropped while drop is set.
func (p *slowProxy) pipe(from, to net.Conn, toSite bool) {
	defer to.Close()
	buf := make([]byte, 32<<10)
	var tail []byte
	for {
		n, err := from.Read(buf)
		if n > 0 && toSite {
			time.Sleep(time.Duration(p.delay.Load()))
			if p.armed.Load() {
				window := append(tail, buf[:n]...)
				if bytes.Contains(window, []byte(".req.go ")) {
					p.armed.Store(false)
					p.drop.Store(true)
					select {
					case p.seen <- struct{}{}:
					default:
					}
				}
				tail = append(tail[:0], window[max(0, len(window)-16):]...)
			}
		}
		if n > 0 && (toSite || !p.drop.Load()) {
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// heal forwards again and cuts the connections (the site reconnects).
func (p *slowProxy) heal() {
	p.drop.Store(false)
	p.cut()
}

func (p *slowProxy) url() string { return "nats://" + p.l.Addr().String() }

func (p *slowProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestFleetWANCutAndKill runs a real physd against a real nats-server with
// JetStream. The hub goes down while the site keeps serving do_ calls (the
// WAN cut); after it comes back the stream holds every audit record once,
// byte for byte as the local audit. Then, over a slow link, physd is
// SIGKILLed in the middle of its replay and restarted: still every record
// exactly once.
func TestFleetWANCutAndKill(t *testing.T) {
	t.Parallel() // its own server on a free port and its own daemon
	hub := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "north-pw", "physd", "north", fleetStreams...))
	js := hubAdmin(t, hub, true)
	proxy := startSlowProxy(t, strings.TrimPrefix(hub.URL(), "nats://"))
	manifest := fleetManifest(t, proxy.url(), "north", "north", "north-pw")
	state := t.TempDir()
	subject := "physd.north.gw_greenhouse_001.audit"

	// The observations, best effort on core NATS.
	nc, err := nats.Connect(hub.URL(), nats.UserInfo(natstest.Admin, natstest.Admin))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	obs, err := nc.SubscribeSync("physd.north.gw_greenhouse_001.obs.>")
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()

	d := startHTTP(t, daemonOpts{manifest: manifest, state: state})
	cs := connectHTTP(t, d, "2026-07-28")
	keys := doCalls(t, cs, "fleet-a", 10)
	waitSynced(t, js, state, 20*time.Second)
	sameTrail(t, js, subject, state)
	m, err := obs.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no observation on the hub: %v", err)
	}
	var o struct {
		Value   any    `json:"value"`
		Quality string `json:"quality"`
	}
	if err := json.Unmarshal(m.Data, &o); err != nil || o.Quality == "" {
		t.Errorf("observation on %s: %s (%v)", m.Subject, m.Data, err)
	}
	t.Logf("observation on %s: %s", m.Subject, m.Data)

	// The WAN cut: the hub is down; the site keeps serving and is ready.
	hub.Stop()
	end := time.Now().Add(10 * time.Second)
	for fleetStatus(t, d)["connected"] != false {
		if time.Now().After(end) {
			t.Fatalf("/status fleet still connected: %v", fleetStatus(t, d))
		}
		time.Sleep(50 * time.Millisecond)
	}
	keys = append(keys, doCalls(t, cs, "fleet-b", 30)...)
	resp, err := http.Get(d.url("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/readyz during the WAN cut: %d, want 200 (a site keeps working)", resp.StatusCode)
	}
	if st := fleetStatus(t, d); st["pending"].(float64) < 30 {
		t.Errorf("/status fleet during the cut: %v, want 30 pending at least", st)
	}
	hub.Start()
	js = hubAdmin(t, hub, false)
	waitSynced(t, js, state, 30*time.Second)
	doResultsOnce(t, sameTrail(t, js, subject, state), keys)

	// A replay killed half way: cut the link, write records, heal it
	// with a slow way back (300 ms: the handshake, two such chunks, stays
	// inside the 1 s connect timeout), SIGKILL physd once the stream has
	// stored the replay's first batch, before its acknowledgement can
	// have reached physd.
	before := hubCount(js)
	proxy.delay.Store(int64(300 * time.Millisecond))
	proxy.cut()
	keys = append(keys, doCalls(t, cs, "fleet-c", 60)...)
	total := uint64(len(localAudit(t, state)))
	end = time.Now().Add(30 * time.Second)
	for {
		n := hubCount(js)
		if n > before {
			t.Logf("SIGKILL with %d of %d records in the stream, the acknowledgement on its way", n, total)
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the replay did not start: %d records, %d before", n, before)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	proxy.delay.Store(0)
	d = startHTTP(t, daemonOpts{manifest: manifest, state: state})
	cs = connectHTTP(t, d, "2026-07-28")
	keys = append(keys, doCalls(t, cs, "fleet-d", 5)...)
	waitSynced(t, js, state, 30*time.Second)
	doResultsOnce(t, sameTrail(t, js, subject, state), keys)
	if st := fleetStatus(t, d); st["connected"] != true || st["pending"].(float64) != 0 {
		t.Errorf("/status fleet after the heal: %v", st)
	}
}

// TestFleetSitePermissions: a gateway holding north's credentials but
// naming itself south is refused by the hub; nothing lands under south,
// and the gateway keeps serving.
func TestFleetSitePermissions(t *testing.T) {
	t.Parallel() // its own server on a free port and its own daemon
	hub := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "north-pw", "physd", "north", fleetStreams...))
	js := hubAdmin(t, hub, true)
	d := startHTTP(t, daemonOpts{manifest: fleetManifest(t, hub.URL(), "south", "north", "north-pw")})
	cs := connectHTTP(t, d, "2026-07-28")
	doCalls(t, cs, "perm", 3)
	end := time.Now().Add(20 * time.Second)
	for {
		st := fleetStatus(t, d)
		// South's inbox (where the hub would answer the cursor's read)
		// is refused before anything is published.
		if e, _ := st["refused"].(string); strings.Contains(e, `Permissions Violation for Subscription to "_PHYSD_SITE.south.`) {
			t.Logf("refused: %s", e)
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no refusal in /status: %v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := fleetStatus(t, d); st["published"].(float64) != 0 {
		t.Errorf("/status fleet: %v, want nothing published", st)
	}
	if got, _ := hubRecords(t, js, "physd.south.gw_greenhouse_001.audit"); len(got) != 0 {
		t.Errorf("the stream holds %d records under south, published with north's credentials", len(got))
	}
	if n := hubCount(js); n != 0 {
		t.Errorf("the stream holds %d messages", n)
	}
}
