package meshtest

import (
	"errors"
	"io"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/memberlist"
)

func TestPacketsPartitionCrashDrop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := NewNetwork(42)
		a, b, c := nw.NewTransport("a"), nw.NewTransport("b"), nw.NewTransport("c")
		if a.Addr() != NthAddr(1) || c.Addr() != NthAddr(3) || nw.Addr("b") != b.Addr() {
			t.Fatalf("addresses %s %s %s", a.Addr(), b.Addr(), c.Addr())
		}
		send := func(from, to *Transport) bool {
			if _, err := from.WriteToAddress([]byte("ping"), memberlist.Address{Addr: to.Addr()}); err != nil {
				t.Fatal(err)
			}
			select {
			case p := <-to.PacketCh():
				if string(p.Buf) != "ping" || p.From.String() != from.Addr() {
					t.Fatalf("packet %+v", p)
				}
				return true
			default:
				return false
			}
		}
		if !send(a, b) || !send(b, c) {
			t.Fatal("healthy network lost a packet")
		}
		nw.Partition([]string{"a"}, []string{"b"})
		if send(a, b) || send(b, a) || !send(a, c) || !send(c, b) {
			t.Fatal("partition a|b wrong")
		}
		nw.Heal()
		if !send(a, b) {
			t.Fatal("heal")
		}
		nw.Crash("c")
		if send(a, c) || send(c, a) {
			t.Fatal("crashed node reachable")
		}
		nw.Restore("c")
		if !send(a, c) {
			t.Fatal("restore")
		}
		nw.Drop(0.25)
		got := 0
		for range 4000 {
			if send(a, b) {
				got++
			}
		}
		if got < 2800 || got > 3200 {
			t.Errorf("25%% loss delivered %d of 4000", got)
		}
		nw.Drop(0)
		nw.Latency(time.Second)
		if send(a, b) {
			t.Fatal("latency ignored")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if len(b.PacketCh()) != 1 {
			t.Fatal("delayed packet not delivered")
		}
		st := nw.Stats()
		if st[0].Name != "a" || st[0].PacketsSent < 4000 || st[0].PacketsDropped < 800 {
			t.Errorf("stats %+v", st[0])
		}
	})
}

func TestStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := NewNetwork(1)
		a, b := nw.NewTransport("a"), nw.NewTransport("b")
		conn, err := a.DialAddressTimeout(memberlist.Address{Addr: b.Addr()}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		srv := <-b.StreamCh()
		if srv.RemoteAddr().String() != a.Addr() {
			t.Errorf("remote addr %s", srv.RemoteAddr())
		}
		go func() { _, _ = conn.Write([]byte("hello")) }()
		buf := make([]byte, 5)
		if _, err := io.ReadFull(srv, buf); err != nil || string(buf) != "hello" {
			t.Fatalf("read %q %v", buf, err)
		}
		// A partition cuts open streams and makes dials time out.
		nw.Partition([]string{"a"}, []string{"b"})
		if _, err := srv.Read(buf); err == nil {
			t.Error("stream survived the partition")
		}
		start := time.Now()
		_, err = a.DialAddressTimeout(memberlist.Address{Addr: b.Addr()}, 3*time.Second)
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || time.Since(start) != 3*time.Second {
			t.Errorf("dial across partition: %v after %v", err, time.Since(start))
		}
		nw.Heal()
		// Unknown and shut-down addresses refuse at once.
		if _, err := a.DialTimeout("10.9.9.9:7946", time.Second); err == nil {
			t.Error("dial to nowhere")
		}
		_ = b.Shutdown()
		if _, err := a.DialTimeout(b.Addr(), time.Second); err == nil {
			t.Error("dial to a shut-down transport")
		}
		if nw.Stats()[0].StreamBytesSent != 5 {
			t.Errorf("stream bytes %+v", nw.Stats()[0])
		}
		_ = a.Shutdown()
	})
}
