// Package mqtt publishes the node's observation stream and its alarm events
// to an MQTT broker (northbound), with Home Assistant discovery.
//
// Topics, under <prefix>/<device_id>/:
//
//	availability          "online" (retained; the last will sets "offline")
//	obs/<tool>            the observation as read_ answers it, JSON, retained,
//	                      published when it changed beyond the deadband
//	alarm/<tool>/<kind>   the last raised or cleared event, JSON, retained
//	do/<tool>             the last do_ result (status, verified, code,
//	                      applied value, idempotency key), JSON, retained,
//	                      read from the audit trail (AuditSink)
//
// and <discovery_prefix>/<sensor|binary_sensor>/<device_id>/<tool>/config
// for each read_ capability (retained), so Home Assistant shows it as a sensor of one
// device per gateway.
//
// A manifest reload (Reload) publishes the discovery configs it added or
// changed, removes those of the capabilities it removed (an empty retained
// payload, which Home Assistant reads as "delete the entity"), and removes
// the retained obs/, alarm/ and do/ topics of removed capabilities.
//
// Publishing is one-way: the publisher subscribes to nothing, so no command
// enters through MQTT. It never blocks the node: observations and events go
// into a bounded queue (dropped and counted when full, or when the broker is
// unreachable); one goroutine publishes; paho reconnects with backoff, and
// on every (re)connect that goroutine publishes availability, the discovery
// configs and the latest retained value of every topic again (outside the
// queue's bound), so a broker that restarted without persistence is whole
// again.
package mqtt

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"golang.org/x/net/proxy"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
)

// Config configures a Publisher.
type Config struct {
	// URL of the broker: tcp:// or mqtt:// (plain), ssl://, tls:// or
	// mqtts:// (TLS), ws:// or wss://, with a port.
	URL string
	// Prefix is the topic prefix (default "physd").
	Prefix string
	// DiscoveryPrefix is Home Assistant's discovery prefix (default
	// "homeassistant"); "-" turns discovery off.
	DiscoveryPrefix string
	// Username and Password for the broker (optional).
	Username, Password string
	// TLS for ssl://, tls://, mqtts:// and wss:// (nil: the system roots).
	TLS *tls.Config
	// Queue bounds the messages waiting for the broker, to be sent or
	// sent and not yet acknowledged (default DefaultQueue plus one per
	// capability of the manifest New is given: a poll round of a plant's
	// points changes thousands of them within milliseconds, and a queue
	// smaller than that burst dropped a third of the changes of a
	// 10 000-point site).
	Queue int
	// MaxReconnect bounds the reconnect backoff (default 10 s).
	MaxReconnect time.Duration
	// PublishTimeout bounds one publish's wait for the broker (default 5 s).
	PublishTimeout time.Duration
	Logger         *slog.Logger
}

// Stats are the publisher's counters (for /metrics).
type Stats struct {
	Published uint64 // messages the broker acknowledged
	// DroppedFull counts messages dropped because the queue was full.
	DroppedFull uint64
	// DroppedOffline counts messages dropped while the broker was not
	// connected or did not acknowledge them in time (retained values are
	// published again on reconnect).
	DroppedOffline uint64
	Connected      bool
}

type message struct {
	topic    string
	payload  []byte
	retained bool
}

// Publisher publishes to one broker.
type Publisher struct {
	cfg      Config
	deviceID string
	base     string // <prefix>/<device_id>
	client   paho.Client
	q        chan message
	audit    chan []byte   // audit lines (AuditSink) waiting to be read
	inflight chan inFlight // sent, waiting for the broker's acknowledgement (acks)
	resyncC  chan struct{} // a (re)connect happened: publish everything again
	log      *slog.Logger
	mu       sync.Mutex
	m        *manifest.Manifest // in force (Reload replaces it)
	tools    map[string]bool    // the tools of m
	retained map[string][]byte  // latest payload of every retained topic
	// removed are retained topics to delete on the broker (an empty
	// retained payload), until the broker acknowledged one: on every
	// (re)connect too, so a broker with persistence that was away during
	// the reload forgets them.
	removed map[string]bool
	// changes are the discovery configs and removals a reload made, for
	// the publishing goroutine (kicked) to send outside the queue's bound.
	changes []message
	kick    chan struct{}
	stop    chan struct{}
	done    sync.WaitGroup
	once    sync.Once

	published, droppedFull, droppedOffline atomic.Uint64
}

// ValidateURL checks a broker URL (scheme and host:port).
func ValidateURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%v; fix: give a URL such as tcp://broker:1883 or mqtts://broker:8883", err)
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss":
	default:
		return fmt.Errorf("scheme %q is not an MQTT scheme; fix: use tcp:// or mqtt:// (plain), mqtts://, ssl:// or tls:// (TLS), ws:// or wss://", u.Scheme)
	}
	if u.Hostname() == "" || u.Port() == "" {
		return fmt.Errorf("%q lacks a host and port; fix: give both, e.g. tcp://broker:1883", raw)
	}
	return nil
}

// ValidateTopicPart checks a topic prefix: not empty, no wildcards, no
// leading or trailing slash.
func ValidateTopicPart(p string) error {
	switch {
	case p == "":
		return errors.New("empty; fix: give a topic prefix such as physd or site1/physd")
	case strings.ContainsAny(p, "+#\x00"):
		return fmt.Errorf("%q contains an MQTT wildcard (+ or #); fix: use plain topic levels", p)
	case strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/"):
		return fmt.Errorf("%q starts or ends with /; fix: remove the slash", p)
	}
	return nil
}

// New builds a publisher for the manifest's device and starts connecting
// in the background (it does not wait for the broker).
func New(cfg Config, m *manifest.Manifest) (*Publisher, error) {
	if err := ValidateURL(cfg.URL); err != nil {
		return nil, fmt.Errorf("mqtt url: %w", err)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "physd"
	}
	if err := ValidateTopicPart(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("mqtt prefix: %w", err)
	}
	if cfg.DiscoveryPrefix == "" {
		cfg.DiscoveryPrefix = "homeassistant"
	}
	if cfg.DiscoveryPrefix != "-" {
		if err := ValidateTopicPart(cfg.DiscoveryPrefix); err != nil {
			return nil, fmt.Errorf("mqtt discovery prefix: %w", err)
		}
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue + len(m.Capabilities)
	}
	if cfg.MaxReconnect <= 0 {
		cfg.MaxReconnect = 10 * time.Second
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &Publisher{cfg: cfg, m: m, deviceID: m.Device.ID, base: cfg.Prefix + "/" + m.Device.ID, q: make(chan message, cfg.Queue), audit: make(chan []byte, 256), inflight: make(chan inFlight, min(MaxInFlight, cfg.Queue)), resyncC: make(chan struct{}, 1),
		log: cfg.Logger.With("component", "mqtt"), retained: map[string][]byte{}, removed: map[string]bool{}, kick: make(chan struct{}, 1), stop: make(chan struct{}),
		tools: toolsOf(m)}
	o := paho.NewClientOptions().AddBroker(cfg.URL).
		SetClientID("physd-"+m.Device.ID).
		SetCleanSession(true).
		SetAutoReconnect(true).
		SetMaxReconnectInterval(cfg.MaxReconnect).
		SetConnectTimeout(5*time.Second).
		SetKeepAlive(30*time.Second).
		SetWriteTimeout(cfg.PublishTimeout).
		SetOrderMatters(false).
		SetWill(p.AvailabilityTopic(), "offline", 1, true).
		SetOnConnectHandler(func(paho.Client) {
			p.log.Info("mqtt connected", "broker", redact(cfg.URL))
			select {
			case p.resyncC <- struct{}{}:
			default:
			}
		}).
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			p.log.Warn("mqtt connection lost; reconnecting with backoff", "err", err.Error())
		})
	if cfg.Username != "" {
		o.SetUsername(cfg.Username)
		o.SetPassword(cfg.Password)
	}
	if cfg.TLS != nil {
		o.SetTLSConfig(cfg.TLS)
	}
	if u, err := url.Parse(cfg.URL); err == nil && (u.Scheme == "tcp" || u.Scheme == "mqtt") {
		o.SetCustomOpenConnectionFn(dialBuffered)
	}
	p.client = paho.NewClient(o)
	p.done.Add(4)
	go p.run()
	go p.acks()
	go p.auditLines()
	go p.connect()
	return p, nil
}

// connect makes the first connection, retrying with backoff (1 s doubling
// to MaxReconnect) until it succeeds or Close; paho's auto-reconnect, with
// the same backoff, takes over after it. Failures are logged on attempts 1,
// 2, 4, 8, … so a wrong password or an unreachable broker shows without
// flooding the log.
func (p *Publisher) connect() {
	defer p.done.Done()
	wait := time.Second
	for attempt := 1; ; attempt++ {
		t := p.client.Connect()
		select {
		case <-t.Done():
		case <-p.stop:
			return
		}
		if t.Error() == nil {
			return
		}
		if attempt&(attempt-1) == 0 {
			p.log.Warn("mqtt broker not connected; retrying with backoff (reads and actuations are not affected)",
				"broker", redact(p.cfg.URL), "attempt", attempt, "retry_in", wait.String(), "err", t.Error().Error())
		}
		select {
		case <-time.After(wait):
		case <-p.stop:
			return
		}
		wait = min(2*wait, p.cfg.MaxReconnect)
	}
}

// dialBuffered opens a plain TCP connection as paho does (its dialer, the
// proxy the environment names), with reads and writes buffered: paho reads
// each packet's fixed header a byte at a time, so every acknowledgement of
// a QoS 1 publish cost three system calls, and writes each packet with
// one; at a plant's thousands of changes a second that was most of the
// publisher's CPU. A TLS connection buffers its records already.
func dialBuffered(u *url.URL, o paho.ClientOptions) (net.Conn, error) {
	c, err := proxy.FromEnvironmentUsing(o.Dialer).Dial("tcp", u.Host)
	if err != nil {
		return nil, err
	}
	return newBufferedConn(c, o.WriteTimeout), nil
}

// flushDelay is how long a written packet may wait in bufferedConn's
// buffer for others to join it: what it adds to a message's delay, next
// to the seconds a poll interval gives an observation.
const flushDelay = 2 * time.Millisecond

// bufferedConn is a connection whose reads go through a buffer and whose
// writes are gathered: a write lands in a buffer that is sent flushDelay
// after the first write into it (or when it fills), in one system call.
// A failed send closes the connection, so paho sees it lost (its reader
// fails) and reconnects; a send is bounded by the write timeout, which the
// flush sets itself (paho's deadlines are for a write, and a write here
// only copies).
type bufferedConn struct {
	net.Conn
	r       *bufio.Reader
	timeout time.Duration

	mu    sync.Mutex
	w     *bufio.Writer
	armed bool  // a flush is scheduled
	err   error // the first failed send: every later write fails with it
}

func newBufferedConn(c net.Conn, timeout time.Duration) *bufferedConn {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	bc := &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, 4096), timeout: timeout}
	bc.w = bufio.NewWriterSize(deadlineWriter{bc}, 32<<10)
	return bc
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (c *bufferedConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(b) // a full buffer is sent here
	if err != nil {
		c.fail(err)
		return n, err
	}
	if !c.armed && c.w.Buffered() > 0 {
		c.armed = true
		time.AfterFunc(flushDelay, c.flush)
	}
	return n, nil
}

// flush sends what the buffer holds.
func (c *bufferedConn) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = false
	if c.err == nil {
		if err := c.w.Flush(); err != nil {
			c.fail(err)
		}
	}
}

// fail records a failed send and closes the connection (c.mu held).
func (c *bufferedConn) fail(err error) {
	c.err = err
	_ = c.Conn.Close()
}

// Close sends what is buffered (paho's DISCONNECT), then closes.
func (c *bufferedConn) Close() error {
	c.mu.Lock()
	if c.err == nil {
		_ = c.w.Flush()
		c.err = net.ErrClosed
	}
	c.mu.Unlock()
	return c.Conn.Close()
}

// SetWriteDeadline and SetDeadline leave the write deadline to the flush.
func (c *bufferedConn) SetWriteDeadline(time.Time) error { return nil }
func (c *bufferedConn) SetDeadline(t time.Time) error    { return c.Conn.SetReadDeadline(t) }

// deadlineWriter sends on the connection within its write timeout.
type deadlineWriter struct{ c *bufferedConn }

func (d deadlineWriter) Write(b []byte) (int, error) {
	if err := d.c.Conn.SetWriteDeadline(time.Now().Add(d.c.timeout)); err != nil {
		return 0, err
	}
	return d.c.Conn.Write(b)
}

// redact drops credentials from a URL for the log.
func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return raw
}

// AvailabilityTopic is <prefix>/<device_id>/availability.
func (p *Publisher) AvailabilityTopic() string { return p.base + "/availability" }

// StateTopic is the topic of a capability's observations.
func (p *Publisher) StateTopic(tool string) string { return p.base + "/obs/" + tool }

// AlarmTopic is the topic of a capability's alarm of one kind.
func (p *Publisher) AlarmTopic(tool, kind string) string {
	return p.base + "/alarm/" + tool + "/" + kind
}

// DiscoveryTopic is Home Assistant's config topic of a read_ capability:
// <discovery_prefix>/<sensor|binary_sensor>/<device_id>/<tool>/config.
func (p *Publisher) DiscoveryTopic(c *manifest.Capability) string {
	return p.cfg.DiscoveryPrefix + "/" + component(c) + "/" + p.deviceID + "/" + c.ToolName() + "/config"
}

// Follow publishes the node's observation stream until Close: the
// observations that count as a change (Observe sends no other).
func (p *Publisher) Follow(n *node.Node) {
	sub := n.SubscribeWhere(0, func(o node.Observed) bool { return o.Changed })
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		defer sub.Close()
		for {
			select {
			case <-p.stop:
				return
			case <-sub.Done():
				return
			case o := <-sub.C:
				p.Observe(o)
			}
		}
	}()
}

// Observe publishes one observation if it counts as a change.
func (p *Publisher) Observe(o node.Observed) {
	if !o.Changed {
		return
	}
	b, err := o.Obs.JSON()
	if err != nil {
		return
	}
	p.send(p.StateTopic(o.Cap.ToolName()), b, true)
}

// Alarm publishes an alarm event (alarms.Engine.OnEvent).
func (p *Publisher) Alarm(ev alarms.Event) {
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	p.send(p.AlarmTopic(ev.Capability, ev.Kind), b, true)
}

// send queues a message without blocking; retained payloads are kept for
// the next reconnect. A message of a tool the manifest in force does not
// declare (an observation or result of the binding a reload replaced) is
// not sent.
func (p *Publisher) send(topic string, b []byte, retained bool) {
	p.mu.Lock()
	if !p.inForce(topic) {
		p.mu.Unlock()
		return
	}
	if retained {
		p.retained[topic] = b
		delete(p.removed, topic)
	}
	p.mu.Unlock()
	select {
	case p.q <- message{topic: topic, payload: b, retained: retained}:
	default:
		p.droppedFull.Add(1)
	}
}

// resync runs on the publishing goroutine after every (re)connect: the
// queued messages are older than the retained values and are dropped
// (counted), then availability, the discovery configs and the latest value
// of every retained topic are published directly, outside the queue's
// bound, so the broker ends up with current state however small the
// queue.
func (p *Publisher) resync() {
	for drained := false; !drained; {
		select {
		case <-p.q:
			p.droppedOffline.Add(1)
		default:
			drained = true
		}
	}
	p.publish(message{topic: p.AvailabilityTopic(), payload: []byte("online"), retained: true})
	p.mu.Lock()
	p.changes = nil // what follows publishes the whole state in force
	msgs := make([]message, 0, len(p.retained)+len(p.removed))
	for t := range p.removed {
		msgs = append(msgs, message{topic: t, payload: []byte{}, retained: true})
	}
	for t, b := range p.discovery(p.m) {
		msgs = append(msgs, message{topic: t, payload: b, retained: true})
	}
	for t, b := range p.retained {
		msgs = append(msgs, message{topic: t, payload: b, retained: true})
	}
	p.mu.Unlock()
	for _, m := range msgs {
		p.publish(m)
	}
}

// DefaultQueue is the queue of a site without capabilities; each
// capability adds one (Config.Queue).
const DefaultQueue = 1024

// MaxInFlight is how many messages may wait for the broker's
// acknowledgement at once (and never more than Config.Queue: a message
// sent and not acknowledged is waiting for the broker too, so a hung
// broker fills the queue and its overflow is counted). Waiting for each
// before sending the next held a publisher to one message per round trip
// (a few hundred a second under load), while a plant's thousands of
// points change every second.
const MaxInFlight = 2048

// inFlight is a message sent and not yet acknowledged.
type inFlight struct {
	m message
	t paho.Token
}

// publish sends one message; its acknowledgement is awaited by acks, at
// most MaxInFlight at a time (publish waits for room). A message not sent
// (no connection) is counted as a drop.
func (p *Publisher) publish(m message) {
	if !p.client.IsConnectionOpen() {
		p.droppedOffline.Add(1)
		return
	}
	t := p.client.Publish(m.topic, 1, m.retained, m.payload)
	select {
	case p.inflight <- inFlight{m, t}:
	case <-p.stop:
	}
}

// acks waits, in order, for the acknowledgement of every message sent
// (each bounded by PublishTimeout): a failure is counted as a drop; a
// removal the broker acknowledged is done.
func (p *Publisher) acks() {
	defer p.done.Done()
	// One timer for all: most messages are acknowledged by the time their
	// turn comes, and a timer each (paho's WaitTimeout) was a tenth of
	// what the publisher allocated.
	timer := time.NewTimer(p.cfg.PublishTimeout)
	timer.Stop()
	for {
		var f inFlight
		select {
		case <-p.stop:
			return
		case f = <-p.inflight:
		}
		acked := true
		select {
		case <-f.t.Done():
		default:
			timer.Reset(p.cfg.PublishTimeout)
			select {
			case <-f.t.Done():
			case <-timer.C:
				acked = false
			case <-p.stop:
				timer.Stop()
				return
			}
			timer.Stop()
		}
		if !acked || f.t.Error() != nil {
			p.droppedOffline.Add(1)
			continue
		}
		p.published.Add(1)
		if f.m.retained && len(f.m.payload) == 0 {
			p.mu.Lock()
			delete(p.removed, f.m.topic)
			p.mu.Unlock()
		}
	}
}

func (p *Publisher) run() {
	defer p.done.Done()
	for {
		select {
		case <-p.stop:
			return
		case <-p.resyncC:
			p.resync()
		case <-p.kick:
			p.mu.Lock()
			msgs := p.changes
			p.changes = nil
			p.mu.Unlock()
			for _, m := range msgs {
				p.mu.Lock()
				// A removal a later reload or value undid is not sent.
				undone := len(m.payload) == 0 && !p.removed[m.topic]
				p.mu.Unlock()
				if !undone {
					p.publish(m)
				}
			}
		case m := <-p.q:
			p.mu.Lock()
			current := p.inForce(m.topic) // queued before a reload removed its tool: not sent
			p.mu.Unlock()
			if current {
				p.publish(m)
			}
		}
	}
}

// Stats returns the counters.
func (p *Publisher) Stats() Stats {
	return Stats{Published: p.published.Load(), DroppedFull: p.droppedFull.Load(),
		DroppedOffline: p.droppedOffline.Load(), Connected: p.client.IsConnectionOpen()}
}

// Close publishes "offline" (when connected) and disconnects.
func (p *Publisher) Close() {
	p.once.Do(func() {
		close(p.stop)
		p.done.Wait()
		if p.client.IsConnectionOpen() {
			p.client.Publish(p.AvailabilityTopic(), 1, true, []byte("offline")).WaitTimeout(time.Second)
		}
		p.client.Disconnect(250)
	})
}
