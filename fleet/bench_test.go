package fleet

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/internal/natscluster"
	"github.com/physd/physd/internal/natstest"
)

// BenchmarkReplay measures how fast a backlog of audit records reaches
// the hub's stream after a cut, one acknowledged publish per record
// (window=1, the uplink before atomic batches) against batches of the
// default window, over a link that adds a round trip (a proxy delaying
// each direction by half of it). Topologies: the gateway straight to an
// embedded server (R1 file stream), and the gateway at its site's leaf
// node with the stream in a 3-server hub cluster (R3), the round trip on
// the leaf's link. One op is one replay of the whole backlog; records/s
// is the figure docs/fleet.md quotes.
//
//	go test -run '^$' -bench BenchmarkReplay -benchtime 1x ./fleet
func BenchmarkReplay(b *testing.B) {
	for _, topo := range []string{"embedded-R1", "leaf-R3"} {
		for _, rtt := range []time.Duration{0, 20 * time.Millisecond, 50 * time.Millisecond} {
			for _, window := range []int{1, DefaultWindow} {
				b.Run(fmt.Sprintf("%s/rtt=%s/window=%d", topo, rtt, window), func(b *testing.B) {
					benchReplay(b, topo, rtt, window)
				})
			}
		}
	}
}

func benchReplay(b *testing.B, topo string, rtt time.Duration, window int) {
	// A backlog that takes about a second or more either way.
	records := 2000
	if window == 1 && rtt > 0 {
		records = int(2*time.Second/rtt) + 1
	}
	var url, user, pw, domain string
	var js jetstream.JetStream
	switch topo {
	case "embedded-R1":
		h := natstest.Start(b, b.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream))
		p := natscluster.NewProxy(b, strings.TrimPrefix(h.URL(), "nats://"))
		p.SetDelay(rtt / 2)
		url, user, pw = "nats://"+p.Addr(), "north", "pw"
		nc, err := nats.Connect(h.URL(), nats.UserInfo(natstest.Admin, natstest.Admin))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		js, _ = jetstream.New(nc)
		createAtomicStream(b, js, 1)
	case "leaf-R3":
		hub := natscluster.StartHub(b, natscluster.HubOptions{Users: []natscluster.User{
			natscluster.SiteUser("north", "north-pw", "physd", "north", "hub", stream)}})
		_, js = hub.Admin(b)
		createAtomicStream(b, js, 3)
		leaf := hub.StartLeaf(b, natscluster.LeafOptions{Site: "north", User: "north", Password: "north-pw"})
		leaf.Link.SetDelay(rtt / 2)
		leaf.WaitLinked(10 * time.Second)
		url, user, pw, domain = leaf.URL(), "", "", hub.Domain()
	}
	// The backlog, on tmpfs when there is one: the fsyncs of filling it
	// are not what is measured.
	dir := b.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "physd-bench-"); err == nil {
			dir = d
			b.Cleanup(func() { os.RemoveAll(d) })
		}
	}
	al, err := audit.OpenWith(dir, audit.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { al.Close() })
	for i := range records {
		if _, err := al.Append(&audit.Record{Event: "do", Tool: "do_heater", Status: "success", Requested: i, Reason: strings.Repeat("x", 200)}); err != nil {
			b.Fatal(err)
		}
	}
	var opts []nats.Option
	if user != "" {
		opts = append(opts, nats.UserInfo(user, pw))
	}
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		// A device the stream has not seen: the whole backlog goes out.
		u, err := New(Config{URLs: []string{url}, Site: "north", DeviceID: fmt.Sprintf("gw_%d", i), Stream: stream, Prefix: "physd",
			Domain: domain, Window: window, Options: opts, ConnectTimeout: 5 * time.Second, PublishTimeout: 10 * time.Second, ReconnectWait: 100 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		began := time.Now()
		u.Start(al)
		end := began.Add(5 * time.Minute)
		for u.Stats().Cursor != uint64(records) {
			if time.Now().After(end) {
				b.Fatalf("replay not done: %+v", u.Stats())
			}
			time.Sleep(time.Millisecond)
		}
		total += time.Since(began)
		if s := u.Stats(); s.Errors != 0 {
			b.Logf("errors during the replay: %+v", s)
		}
		u.Close()
	}
	b.ReportMetric(float64(records*b.N)/total.Seconds(), "records/s")
	b.ReportMetric(float64(records), "backlog")
}
