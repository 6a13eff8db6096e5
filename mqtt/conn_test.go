package mqtt

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/manifest"
)

// countingConn counts the writes that reach the connection.
type countingConn struct {
	net.Conn
	writes atomic.Int32
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// TestBufferedConnGathersWrites: packets written one by one reach the
// broker whole and in order, in one send, flushDelay after the first.
func TestBufferedConnGathersWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client, broker := net.Pipe()
		defer broker.Close()
		cc := &countingConn{Conn: client}
		bc := newBufferedConn(cc, time.Second)
		defer bc.Close()
		var want []byte
		for i := range 100 {
			p := []byte{0x32, byte(i), 'x', 'y'}
			want = append(want, p...)
			if _, err := bc.Write(p); err != nil {
				t.Fatal(err)
			}
		}
		got := make(chan []byte)
		go func() {
			b := make([]byte, len(want))
			_, _ = io.ReadFull(broker, b)
			got <- b
		}()
		synctest.Wait()
		if n := cc.writes.Load(); n != 0 {
			t.Fatalf("%d sends before flushDelay passed", n)
		}
		time.Sleep(flushDelay)
		if b := <-got; !bytes.Equal(b, want) {
			t.Fatalf("the broker read %x, want %x", b, want)
		}
		if n := cc.writes.Load(); n != 1 {
			t.Errorf("%d sends for 100 packets, want 1", n)
		}
	})
}

// TestBufferedConnHungBroker: a broker that reads nothing fails the send
// within the write timeout; the connection is closed (paho's reader sees
// it lost and reconnects) and every later write fails at once.
func TestBufferedConnHungBroker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client, broker := net.Pipe() // nothing reads broker
		defer broker.Close()
		bc := newBufferedConn(client, 5*time.Second)
		start := time.Now()
		if _, err := bc.Write([]byte("publish")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(flushDelay + 5*time.Second)
		synctest.Wait()
		if _, err := bc.Write([]byte("next")); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a write after the failed send: %v, want the deadline error", err)
		}
		if _, err := bc.Read(make([]byte, 1)); err == nil {
			t.Fatal("the connection is still open after the failed send")
		}
		if el := time.Since(start); el > flushDelay+5*time.Second {
			t.Errorf("the send failed after %v, beyond the 5 s write timeout", el)
		}
	})
}

// TestQueueGrowsWithTheSite: the default queue holds a poll round's
// changes of every point (plus room for events), so the burst a plant's
// round makes is not dropped; a queue the operator sets is kept.
func TestQueueGrowsWithTheSite(t *testing.T) {
	m := testManifest()
	for i := range 3000 {
		m.Capabilities = append(m.Capabilities, &manifest.Capability{Name: fmt.Sprintf("p%04d", i), Kind: "read", DataType: "float"})
	}
	p, err := New(Config{URL: deadURL(t)}, m)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got, want := cap(p.q), DefaultQueue+len(m.Capabilities); got != want {
		t.Errorf("default queue %d, want %d", got, want)
	}
	q, err := New(Config{URL: deadURL(t), Queue: 8}, m)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if cap(q.q) != 8 || cap(q.inflight) != 8 {
		t.Errorf("--mqtt-queue 8: queue %d, in flight %d", cap(q.q), cap(q.inflight))
	}
}
