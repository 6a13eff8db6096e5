// Package fleet is the site uplink: a gateway connects to the site's hub
// over NATS and publishes its observations and alarm events as core NATS
// messages (best effort, the latest wins) and its audit records (which
// carry the do_ results) to a JetStream stream, exactly once.
//
// The local audit trail stays the source of truth and the stream is its
// durable copy. The uplink keeps no queue of its own: it reads the audit
// files from a cursor, the last audit seq the stream holds for this
// device, which it asks the stream for on start and after every
// reconnect. Each record is published with Nats-Msg-Id <device>/<seq> and
// with Nats-Expected-Last-Subject-Sequence set to the stream sequence of
// the device's previous record, one at a time: a record whose
// acknowledgement was lost (a WAN cut, a SIGKILL) is found in the stream
// at the next sync and not sent again, and a record can never land after
// a gap, however long the cut lasted (the deduplication window is the
// second guard, not the first).
package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
)

// Headers of an audit record in the stream (besides Nats-Msg-Id).
const (
	HeaderSeq    = "Physd-Audit-Seq"
	HeaderEvent  = "Physd-Event"
	HeaderDevice = "Physd-Device"
)

// DefaultDuplicates is the deduplication window of a stream physd
// creates.
const DefaultDuplicates = 10 * time.Minute

// Config is the uplink's configuration: the manifest's network.fleet,
// with the secrets read.
type Config struct {
	URLs           []string
	Site, DeviceID string
	Stream, Prefix string
	// Options authenticate and secure the connection (credentials, NKey,
	// user and password, TLS); see Options.
	Options        []nats.Option
	ConnectTimeout time.Duration
	PublishTimeout time.Duration
	// ReconnectWait is the pause between reconnect attempts (default 1 s).
	ReconnectWait time.Duration
	Logger        *slog.Logger
}

// Options turns network.fleet's credentials and TLS into NATS options,
// reading the files now (a missing or unreadable file is an error at
// start, not a silent anonymous connection).
func Options(f *manifest.Fleet) ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case f.CredentialsFile != "":
		if _, err := os.Stat(f.CredentialsFile); err != nil {
			return nil, fmt.Errorf("network.fleet.credentials_file: %w; fix: the path of a file physd can read (it is read at start)", err)
		}
		opts = append(opts, nats.UserCredentials(f.CredentialsFile))
	case f.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(f.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("network.fleet.nkey_seed_file: %w; fix: the path of a file physd can read (it is read at start)", err)
		}
		opts = append(opts, o)
	case f.User != "":
		pw := ""
		if f.PasswordFile != "" {
			b, err := os.ReadFile(f.PasswordFile)
			if err != nil {
				return nil, fmt.Errorf("network.fleet.password_file: %w; fix: the path of a file physd can read (it is read at start)", err)
			}
			pw = strings.TrimRight(string(b), "\r\n")
		}
		opts = append(opts, nats.UserInfo(f.User, pw))
	}
	if f.UsesTLS() {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if f.TLSCA != "" {
			b, err := os.ReadFile(f.TLSCA)
			if err != nil {
				return nil, fmt.Errorf("network.fleet.tls.ca: %w; fix: the path of a file physd can read (it is read at start)", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(b) {
				return nil, fmt.Errorf("network.fleet.tls.ca %s holds no PEM certificate; fix: the CA certificate that issued the hub's, PEM-encoded", f.TLSCA)
			}
		}
		if f.TLSCert != "" {
			cert, err := tls.LoadX509KeyPair(f.TLSCert, f.TLSKey)
			if err != nil {
				return nil, fmt.Errorf("network.fleet.tls.cert/key: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// ConfigFromManifest is the uplink's configuration for this gateway (nil
// without an enabled network.fleet).
func ConfigFromManifest(m *manifest.Manifest, log *slog.Logger) (*Config, error) {
	f := m.Network.Fleet
	if f == nil || !f.Enabled {
		return nil, nil
	}
	opts, err := Options(f)
	if err != nil {
		return nil, err
	}
	return &Config{URLs: f.URLs, Site: f.Site, DeviceID: m.Device.ID, Stream: f.Stream, Prefix: f.SubjectPrefix, Options: opts,
		ConnectTimeout: time.Duration(f.ConnectTimeoutMS) * time.Millisecond, PublishTimeout: time.Duration(f.PublishTimeoutMS) * time.Millisecond,
		Logger: log}, nil
}

// Stats are the uplink's counters.
type Stats struct {
	Connected bool `json:"connected"`
	// Synced is true once the cursor was read from the stream since the
	// last (re)connect.
	Synced bool `json:"synced"`
	// Cursor is the last audit seq the stream is known to hold for this
	// device (0 until the first sync); Local the last on local disk;
	// Pending the difference (before the first sync, every local record).
	Cursor  uint64 `json:"cursor"`
	Local   uint64 `json:"local_seq"`
	Pending uint64 `json:"pending"`
	// Published counts audit records the stream acknowledged (this run),
	// Core the observations and alarm events sent, Dropped the ones not
	// sent (not connected), Errors failed syncs and publishes.
	Published uint64 `json:"published"`
	Core      uint64 `json:"core_published"`
	Dropped   uint64 `json:"core_dropped"`
	Errors    uint64 `json:"errors"`
	LastError string `json:"last_error,omitempty"`
	// AuditError is the last error of the audit path (sync or publish);
	// cleared once a record is acknowledged.
	AuditError string `json:"audit_error,omitempty"`
	// Refused is the hub's last refusal of the audit subject (a
	// permissions violation: these credentials may not publish as this
	// site and device).
	Refused string `json:"refused,omitempty"`
	Server  string `json:"server,omitempty"`
}

// Uplink publishes one gateway's records to the hub.
type Uplink struct {
	cfg     Config
	log     *slog.Logger
	nc      atomic.Pointer[nats.Conn] // set once connected
	js      jetstream.JetStream       // the loop's only
	al      *audit.Log
	base    string // <prefix>.<site>.<device>
	subject string // base + ".audit"

	nudge chan struct{}
	stop  chan struct{}
	done  sync.WaitGroup
	once  sync.Once

	connected  atomic.Bool
	synced     atomic.Bool
	cursor     atomic.Uint64
	published  atomic.Uint64
	core       atomic.Uint64
	dropped    atomic.Uint64
	errs       atomic.Uint64
	mu         sync.Mutex
	lastErr    string
	auditErr   string
	refused    string
	streamSeq  uint64 // the stream sequence of the device's last record (loop only)
	createOnce bool
	onConnect  []func(*nats.Conn) // OnConnect's (set before Start)
}

// OnConnect registers f, called with the connection after every connect
// and reconnect (the serving side, serve.go, starts on the first). Call it
// before Start; f must not block.
func (u *Uplink) OnConnect(f func(*nats.Conn)) { u.onConnect = append(u.onConnect, f) }

// New checks the configuration; Start connects.
func New(cfg Config) (*Uplink, error) {
	if len(cfg.URLs) == 0 || cfg.Site == "" || cfg.DeviceID == "" || cfg.Stream == "" || cfg.Prefix == "" {
		return nil, errors.New("fleet: urls, site, device id, stream and prefix are required")
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 5 * time.Second
	}
	if cfg.ReconnectWait <= 0 {
		cfg.ReconnectWait = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	base := cfg.Prefix + "." + cfg.Site + "." + cfg.DeviceID
	return &Uplink{cfg: cfg, log: cfg.Logger.With("component", "fleet"), base: base, subject: base + ".audit",
		nudge: make(chan struct{}, 1), stop: make(chan struct{})}, nil
}

// AuditSubject is the subject of this device's audit records.
func (u *Uplink) AuditSubject() string { return u.subject }

// StreamSubjects are the subjects of a stream physd creates: every
// site's and device's audit records under the prefix.
func StreamSubjects(prefix string) []string { return []string{prefix + ".*.*.audit"} }

// AuditSink is the audit.Sink that wakes the uplink when a record is on
// disk: one non-blocking send, nothing queued (the uplink reads the
// files). Close does nothing (Uplink.Close ends the uplink).
func (u *Uplink) AuditSink() audit.Sink { return sink{u} }

type sink struct{ u *Uplink }

func (s sink) Send([]byte) { s.u.wake() }
func (sink) Close() error  { return nil }

func (u *Uplink) wake() {
	select {
	case u.nudge <- struct{}{}:
	default:
	}
}

// Start connects in the background (a hub that cannot be reached, or is
// slow to answer, never delays the gateway) and publishes the audit trail
// al from then on.
func (u *Uplink) Start(al *audit.Log) {
	u.al = al
	opts := append([]nats.Option{
		nats.Name("physd " + u.cfg.Site + "/" + u.cfg.DeviceID),
		nats.Timeout(u.cfg.ConnectTimeout),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(u.cfg.ReconnectWait),
		// Nothing is buffered while disconnected: a publish fails at once
		// (the audit records are re-read from the files; an observation
		// is stale by the time the link heals).
		nats.ReconnectBufSize(-1),
		nats.ConnectHandler(u.onConnected),
		nats.ReconnectHandler(u.onConnected),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			u.connected.Store(false)
			u.synced.Store(false)
			if err != nil {
				u.log.Warn("fleet hub disconnected; the gateway keeps serving, records are sent after the link returns", "err", err.Error())
			}
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				return
			}
			u.mu.Lock()
			again := u.lastErr == "connect: "+err.Error()
			u.lastErr = "connect: " + err.Error()
			u.mu.Unlock()
			if !again {
				u.log.Warn("fleet: the hub is not reachable; the gateway keeps serving, records are sent once it is", "err", err.Error())
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			u.fail("nats", err)
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+u.subject+`"`) {
				u.mu.Lock()
				u.refused = err.Error()
				u.mu.Unlock()
				u.log.Error("fleet: the hub refuses this gateway's audit subject; fix: credentials for this site, or the site they are for in network.fleet.site", "err", err.Error())
			}
		}),
	}, u.cfg.Options...)
	u.done.Add(1)
	go func() {
		defer u.done.Done()
		if u.connect(opts) {
			u.loop()
		}
	}()
}

// connect dials until it has a connection (nats.go then reconnects by
// itself) or the uplink is closed.
func (u *Uplink) connect(opts []nats.Option) bool {
	for {
		nc, err := nats.Connect(strings.Join(u.cfg.URLs, ","), opts...)
		if err == nil {
			var js jetstream.JetStream
			if js, err = jetstream.New(nc); err == nil {
				u.js = js
				u.nc.Store(nc)
				if nc.IsConnected() {
					u.onConnected(nc)
				}
				return true
			}
			nc.Close()
		}
		u.fail("connect", err)
		u.log.Error("fleet: cannot connect to the hub; retrying", "err", err.Error())
		select {
		case <-u.stop:
			return false
		case <-time.After(u.cfg.ReconnectWait):
		}
	}
}

func (u *Uplink) onConnected(nc *nats.Conn) {
	u.connected.Store(true)
	u.synced.Store(false)
	u.log.Info("fleet hub connected", "server", nc.ConnectedUrlRedacted())
	u.wake()
	for _, f := range u.onConnect {
		f(nc)
	}
}

func (u *Uplink) fail(what string, err error) {
	u.errs.Add(1)
	u.mu.Lock()
	u.lastErr = what + ": " + err.Error()
	u.mu.Unlock()
}

// loop syncs the cursor and publishes what the stream does not hold yet,
// on every audit record, every (re)connect, and once a second.
func (u *Uplink) loop() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	backoff := time.Time{}
	for {
		select {
		case <-u.stop:
			return
		case <-u.nudge:
		case <-tick.C:
		}
		if !u.nc.Load().IsConnected() || time.Now().Before(backoff) {
			continue
		}
		if err := u.drain(); err != nil {
			u.synced.Store(false)
			u.fail("audit", err)
			u.mu.Lock()
			again := u.auditErr == err.Error()
			u.auditErr = err.Error()
			u.mu.Unlock()
			if !again { // the same error retried every second is logged once
				u.log.Warn("fleet: audit records not published yet; retrying", "err", err.Error(), "cursor", u.cursor.Load())
			}
			backoff = time.Now().Add(u.cfg.ReconnectWait)
		}
	}
}

// sync asks the stream for the last record it holds for this device.
func (u *Uplink) sync() error {
	ctx, cancel := context.WithTimeout(context.Background(), u.cfg.PublishTimeout)
	defer cancel()
	st, err := u.js.Stream(ctx, u.cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = u.js.CreateStream(ctx, jetstream.StreamConfig{
			Name: u.cfg.Stream, Subjects: StreamSubjects(u.cfg.Prefix), Storage: jetstream.FileStorage,
			Duplicates: DefaultDuplicates, AllowDirect: true,
		})
		if err != nil {
			return fmt.Errorf("the hub has no stream %s and physd may not create it (%w); fix: create it on the hub with the subjects %s", u.cfg.Stream, err, StreamSubjects(u.cfg.Prefix)[0])
		}
		u.log.Info("fleet: stream created", "stream", u.cfg.Stream)
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", u.cfg.Stream, err)
	}
	msg, err := st.GetLastMsgForSubject(ctx, u.subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		u.streamSeq = 0
		u.cursor.Store(0)
		u.synced.Store(true)
		return nil
	}
	if err != nil {
		return fmt.Errorf("the last record of %s: %w", u.subject, err)
	}
	seq, err := strconv.ParseUint(msg.Header.Get(HeaderSeq), 10, 64)
	if err != nil {
		return fmt.Errorf("the last record of %s has no %s header", u.subject, HeaderSeq)
	}
	if local := u.al.Seq(); seq > local {
		return fmt.Errorf("the stream holds audit seq %d for %s, the local audit ends at %d (a state directory reset, or two gateways with one device.id); fix: give this gateway a new device.id, or move the old records aside on the hub", seq, u.cfg.DeviceID, local)
	}
	// The record the stream holds must be the local one, byte for byte.
	var same = true
	err = u.al.ReadAfter(seq-1, func(_ uint64, line []byte) error {
		same = string(line) == string(msg.Data)
		return errStop
	})
	var gap *audit.ErrGap
	if errors.As(err, &gap) {
		same = true // the local record is past the retention: nothing to compare
	} else if err != nil && !errors.Is(err, errStop) {
		return err
	}
	if !same {
		return fmt.Errorf("the stream's audit seq %d of %s is not the local record (another trail under this device.id); fix: give this gateway a new device.id", seq, u.cfg.DeviceID)
	}
	u.streamSeq = msg.Sequence
	u.cursor.Store(seq)
	u.synced.Store(true)
	return nil
}

var errStop = errors.New("stop")

// drain publishes the local records after the cursor, one at a time, each
// acknowledged before the next.
func (u *Uplink) drain() error {
	for gaps := 0; ; {
		if !u.synced.Load() {
			if err := u.sync(); err != nil {
				return err
			}
		}
		err := u.al.ReadAfter(u.cursor.Load(), u.publish)
		if errors.Is(err, errResync) {
			continue
		}
		var gap *audit.ErrGap
		if errors.As(err, &gap) {
			// A rotation between the listing and the read: read again. A
			// gap that stays is a damaged line (physd audit verify).
			if gaps++; gaps < 3 {
				continue
			}
			u.log.Error("fleet: the local audit has a gap; the missing records cannot be sent (physd audit verify names them)", "want", gap.Want, "found", gap.Got)
			u.fail("audit gap", err)
			u.cursor.Store(gap.Got - 1)
			continue
		}
		return err
	}
}

func (u *Uplink) publish(seq uint64, line []byte) error {
	select {
	case <-u.stop:
		return errStop
	default:
	}
	var ev struct {
		Event string `json:"event"`
	}
	_ = json.Unmarshal(line, &ev)
	m := nats.NewMsg(u.subject)
	m.Data = line
	m.Header.Set(jetstream.MsgIDHeader, u.cfg.DeviceID+"/"+strconv.FormatUint(seq, 10))
	m.Header.Set(HeaderSeq, strconv.FormatUint(seq, 10))
	m.Header.Set(HeaderDevice, u.cfg.DeviceID)
	if ev.Event != "" {
		m.Header.Set(HeaderEvent, ev.Event)
	}
	ctx, cancel := context.WithTimeout(context.Background(), u.cfg.PublishTimeout)
	defer cancel()
	ack, err := u.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(u.streamSeq), jetstream.WithRetryAttempts(0))
	if err != nil {
		// Unknown whether it landed: the next sync reads the stream.
		u.synced.Store(false)
		return fmt.Errorf("audit seq %d: %w", seq, err)
	}
	if ack.Duplicate {
		// Already stored (an earlier attempt whose ack was lost); the
		// stream sequence the ack names is the original's, resync.
		u.synced.Store(false)
		u.cursor.Store(seq)
		return errResync
	}
	u.streamSeq = ack.Sequence
	u.cursor.Store(seq)
	if u.published.Add(1) == 1 || u.auditErrSet() {
		u.mu.Lock()
		u.auditErr = ""
		u.mu.Unlock()
	}
	return nil
}

var errResync = errors.New("resync")

func (u *Uplink) auditErrSet() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.auditErr != ""
}

// Follow publishes the node's observations that count as a change.
func (u *Uplink) Follow(n *node.Node) {
	sub := n.Subscribe(0)
	u.done.Add(1)
	go func() {
		defer u.done.Done()
		defer sub.Close()
		for {
			select {
			case <-u.stop:
				return
			case <-sub.Done():
				return
			case o := <-sub.C:
				u.Observe(o)
			}
		}
	}()
}

// ObsSubject is the subject of a capability's observations.
func (u *Uplink) ObsSubject(tool string) string { return u.base + ".obs." + tool }

// AlarmSubject is the subject of a capability's alarm events.
func (u *Uplink) AlarmSubject(tool, kind string) string {
	return u.base + ".alarm." + tool + "." + kind
}

// Observe publishes one observation if it counts as a change.
func (u *Uplink) Observe(o node.Observed) {
	if !o.Changed || o.Cap == nil {
		return
	}
	b, err := json.Marshal(o.Obs)
	if err != nil {
		return
	}
	u.core1(u.ObsSubject(o.Cap.ToolName()), b)
}

// Alarm publishes an alarm event (alarms.Engine.OnEvent).
func (u *Uplink) Alarm(ev alarms.Event) {
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	u.core1(u.AlarmSubject(ev.Capability, ev.Kind), b)
}

// core1 sends a best-effort message; not connected, it is dropped (and
// counted): nats.go buffers nothing while disconnected.
func (u *Uplink) core1(subject string, b []byte) {
	nc := u.nc.Load()
	if nc == nil || !nc.IsConnected() || nc.Publish(subject, b) != nil {
		u.dropped.Add(1)
		return
	}
	u.core.Add(1)
}

// Stats reports the uplink's state.
func (u *Uplink) Stats() Stats {
	nc := u.nc.Load()
	s := Stats{Connected: u.connected.Load() && nc != nil && nc.IsConnected(), Synced: u.synced.Load(), Cursor: u.cursor.Load(),
		Published: u.published.Load(), Core: u.core.Load(), Dropped: u.dropped.Load(), Errors: u.errs.Load()}
	if u.al != nil {
		s.Local = u.al.Seq()
	}
	if s.Local > s.Cursor {
		s.Pending = s.Local - s.Cursor
	}
	u.mu.Lock()
	s.LastError, s.AuditError, s.Refused = u.lastErr, u.auditErr, u.refused
	u.mu.Unlock()
	if s.Connected {
		s.Server = nc.ConnectedUrlRedacted()
	}
	return s
}

// Close stops publishing and closes the connection (an acknowledgement
// under way is waited for, within the publish timeout).
func (u *Uplink) Close() {
	u.once.Do(func() {
		close(u.stop)
		u.done.Wait()
		if nc := u.nc.Load(); nc != nil {
			_ = nc.FlushTimeout(time.Second)
			nc.Close()
		}
	})
}
