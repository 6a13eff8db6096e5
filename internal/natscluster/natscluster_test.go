package natscluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/hub"
)

const stream = "PHYSD_AUDIT"

func createR3(t *testing.T, js jetstream.JetStream, replicas int) {
	t.Helper()
	CreateStream(t, js, jetstream.StreamConfig{Name: stream, Subjects: []string{"physd.*.*.audit"}, Replicas: replicas,
		Storage: jetstream.FileStorage, AllowDirect: true, AllowAtomicPublish: true, Duplicates: time.Minute})
}

func adminJS(t *testing.T, h *Hub) jetstream.JetStream {
	_, js := h.Admin(t)
	return js
}

// TestLeafReachesHubJetStream: a client of a site's leaf (no JetStream on
// the leaf) reads the last message of its subject from the hub's R3
// stream and publishes with the expected-sequence header, by the hub's
// domain; publishing as another site is refused on the leaf link; a cut
// of the link fails requests at once (no responders) with the client
// still connected to its leaf; after the heal the same connection works;
// the stream survives one hub server's death.
func TestLeafReachesHubJetStream(t *testing.T) {
	h := StartHub(t, HubOptions{Users: []User{SiteUser("north", "north-pw", "physd", "north", "hub", stream)}})
	createR3(t, adminJS(t, h), 3)
	leaf := h.StartLeaf(t, LeafOptions{Site: "north", User: "north", Password: "north-pw", Local: []User{{Name: "gw", Password: "gw-pw"}}})
	leaf.WaitLinked(10 * time.Second)

	nc, err := nats.Connect(leaf.URL(), nats.UserInfo("gw", "gw-pw"), nats.CustomInboxPrefix(hub.SiteInbox("north")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	publish := func(subject string, expect uint64) (*jetstream.PubAck, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return js.Publish(ctx, subject, []byte("x"), jetstream.WithExpectLastSequencePerSubject(expect), jetstream.WithRetryAttempts(0))
	}
	last := func() (uint64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return 0, err
		}
		m, err := st.GetLastMsgForSubject(ctx, "physd.north.gw_1.audit")
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		return m.Sequence, nil
	}
	// publishUntil publishes after expect until the hub takes it.
	publishUntil := func(what string, expect uint64, d time.Duration) *jetstream.PubAck {
		t.Helper()
		end := time.Now().Add(d)
		for {
			ack, err := publish("physd.north.gw_1.audit", expect)
			if err == nil {
				return ack
			}
			if time.Now().After(end) {
				t.Fatalf("publish %s: %v", what, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// The interest of the hub's stream reaches the leaf a moment after
	// the link comes up.
	ack := publishUntil("through the leaf", 0, 10*time.Second)
	if ack.Domain != h.Domain() {
		t.Errorf("ack from domain %q, want %q", ack.Domain, h.Domain())
	}
	if seq, err := last(); err != nil || seq != ack.Sequence {
		t.Fatalf("last: %d %v, want %d", seq, err, ack.Sequence)
	}
	if _, err := publish("physd.north.gw_1.audit", ack.Sequence+7); err == nil {
		t.Error("a publish expecting the wrong last sequence was stored")
	}

	// Another site's subject: the hub refuses it on the leaf link.
	if _, err := publish("physd.south.gw_1.audit", 0); err == nil {
		t.Error("north's leaf published under south")
	}

	// The WAN cut: the client stays connected to its leaf; the hub's
	// JetStream is gone until the heal.
	leaf.Link.Cut()
	end := time.Now().Add(10 * time.Second)
	for leaf.Linked() {
		if time.Now().After(end) {
			t.Fatal("the leaf still reports its link after the cut")
		}
		time.Sleep(20 * time.Millisecond)
	}
	began := time.Now()
	_, err = publish("physd.north.gw_1.audit", ack.Sequence)
	if err == nil {
		t.Fatal("a publish during the cut was acknowledged")
	}
	t.Logf("publish during the cut: %v after %s", err, time.Since(began).Round(time.Millisecond))
	if !nc.IsConnected() {
		t.Error("the client lost its leaf during the WAN cut")
	}
	leaf.Link.Heal()
	leaf.WaitLinked(10 * time.Second)
	ack = publishUntil("after the heal", ack.Sequence, 10*time.Second)

	// A hub server dies: the R3 stream keeps its messages and takes more.
	h.Servers[0].Kill()
	ack = publishUntil("with a hub server dead", ack.Sequence, 20*time.Second)
	if seq, err := last(); err != nil || seq != ack.Sequence {
		t.Fatalf("last with a hub server dead: %d %v, want %d", seq, err, ack.Sequence)
	}
	h.Servers[0].Restart()
}

// TestLeafWithJetStreamNeedsDomain: when the leaf runs JetStream itself,
// $JS.API requests stay at the leaf; the hub's stream is reached by its
// domain only.
func TestLeafWithJetStreamNeedsDomain(t *testing.T) {
	h := StartHub(t, HubOptions{Servers: 1, Users: []User{SiteUser("north", "north-pw", "physd", "north", "hub", stream)}})
	createR3(t, adminJS(t, h), 1)
	leaf := h.StartLeaf(t, LeafOptions{Site: "north", User: "north", Password: "north-pw", JetStreamDomain: "north"})
	leaf.WaitLinked(10 * time.Second)
	nc, err := nats.Connect(leaf.URL(), nats.CustomInboxPrefix(hub.SiteInbox("north")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	local, _ := jetstream.New(nc)
	if _, err := local.Stream(ctx, stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("$JS.API at a leaf with JetStream: %v, want stream not found (the leaf's own JetStream answers)", err)
	}
	hub, _ := jetstream.NewWithDomain(nc, h.Domain())
	end := time.Now().Add(10 * time.Second)
	for {
		_, err := hub.Stream(ctx, stream)
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the hub's stream by its domain: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestProxy: delay, stall and cut do what they say on a plain TCP echo.
func TestProxy(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p := NewProxy(t, l.Addr().String())
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(s string) (string, time.Duration, error) {
		began := time.Now()
		if _, err := c.Write([]byte(s)); err != nil {
			return "", 0, err
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, len(s))
		_, err := io.ReadFull(c, buf)
		return string(buf), time.Since(began), err
	}
	if got, _, err := echo("a"); err != nil || got != "a" {
		t.Fatalf("echo: %q %v", got, err)
	}
	p.SetDelay(50 * time.Millisecond)
	if _, d, err := echo("b"); err != nil || d < 100*time.Millisecond {
		t.Errorf("round trip with 50 ms each way: %s %v", d, err)
	}
	p.SetDelay(0)
	p.Stall()
	if _, err := c.Write([]byte("c")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _ := c.Read(make([]byte, 1)); n != 0 {
		t.Error("a stalled link delivered")
	}
	p.Heal()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(c, buf); err != nil || buf[0] != 'c' {
		t.Errorf("after the heal: %q %v, want the stalled byte", buf, err)
	}
	p.Cut()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(buf); err == nil {
		t.Error("a cut connection still reads")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.Write([]byte("d"))
	c2.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _ := c2.Read(buf); n != 0 {
		t.Error("a connection made during the cut was answered")
	}
	p.Heal()
	c2.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c2.Read(buf); err == nil || !strings.Contains(fmt.Sprint(err), "EOF") && !strings.Contains(fmt.Sprint(err), "reset") {
		t.Errorf("a held connection after the heal: %v, want closed", err)
	}
}
