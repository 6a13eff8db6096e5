// Package fleet is the site uplink: a gateway connects to the site's hub
// over NATS and publishes its observations and alarm events as core NATS
// messages (best effort, the latest wins) and its audit records (which
// carry the do_ results) to a JetStream stream, exactly once.
//
// The local audit trail stays the source of truth and the stream is its
// durable copy. The uplink keeps no queue of its own: it reads the audit
// files from a cursor, the last audit seq the stream holds for this
// device, which it asks the stream for on start and after every
// reconnect or failure. Each record is published with Nats-Msg-Id
// <site>/<device>/<seq>, conditional on the stream sequence of the device's
// previous record (Nats-Expected-Last-Subject-Sequence), in atomic
// batches of up to Config.Window records (one round trip per batch; see
// chain): a record whose acknowledgement was lost (a WAN cut, a SIGKILL)
// is found in the stream at the next sync and not sent again, and a
// record can never land after a gap, however long the cut lasted (the
// deduplication window is the second guard, not the first).
//
// The gateway may talk to the hub directly or to a NATS leaf node at its
// site (Config.Domain names the hub's JetStream domain). Through a leaf,
// a WAN cut does not drop the gateway's own connection: the uplink
// notices failed or unanswered requests and syncs again once a second
// until the hub answers.
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
	"github.com/physd/physd/hub"
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
	// Domain is the hub's JetStream domain: needed when the gateway
	// connects to a leaf node that runs JetStream itself (its $JS.API is
	// the leaf's); "" addresses $JS.API.
	Domain string
	// Window is the most records one atomic batch carries (default
	// DefaultWindow; 1: one acknowledged publish per record).
	Window int
	// History copies the sealed history buckets to HistoryStream
	// (FollowHistory); Alarms the active alarms to AlarmStream
	// (FollowAlarms).
	History       bool
	HistoryStream string
	Alarms        bool
	AlarmStream   string
	// Refresh is how often the history and alarm copies look for work
	// without being told (an acknowledged alarm changes the state without
	// an event) and retry after a failure (default 5 s).
	Refresh time.Duration
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
	return ConfigFor(m.Network.Fleet, m.Device.ID, log)
}

// ConfigFor is the uplink's configuration from a network.fleet block (the
// manifest's, or the one physd run's --fleet-* flags made): nil without
// one, or with enabled: false.
func ConfigFor(f *manifest.Fleet, deviceID string, log *slog.Logger) (*Config, error) {
	if f == nil || !f.Enabled {
		return nil, nil
	}
	opts, err := Options(f)
	if err != nil {
		return nil, err
	}
	return &Config{URLs: f.URLs, Site: f.Site, DeviceID: deviceID, Stream: f.Stream, Prefix: f.SubjectPrefix, Domain: f.Domain, Options: opts,
		History: f.History, HistoryStream: f.HistoryStream, Alarms: f.Alarms, AlarmStream: f.AlarmStream,
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
	// HistoryPublished counts history buckets and AlarmsPublished alarm
	// snapshots the hub's streams acknowledged (this run); HistoryError
	// and AlarmsError are their paths' last errors, cleared on success.
	HistoryPublished uint64 `json:"history_published"`
	HistoryError     string `json:"history_error,omitempty"`
	AlarmsPublished  uint64 `json:"alarms_published"`
	AlarmsError      string `json:"alarms_error,omitempty"`
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
	js      jetstream.JetStream
	audit   chain // the audit records' (the loop's only)
	al      *audit.Log
	base    string // <prefix>.<site>.<device>
	subject string // base + ".audit"

	nudge chan struct{}
	stop  chan struct{}
	// life ends at Close: every request to the hub is bounded by it as
	// well as by its timeout, so a hub that does not answer (a cut WAN, a
	// refused inbox) holds up no shutdown: the outputs' safe states on
	// shutdown come after the uplink stops.
	life    context.Context
	endLife context.CancelFunc
	done    sync.WaitGroup
	once    sync.Once

	connected atomic.Bool
	synced    atomic.Bool
	conns     atomic.Uint64 // (re)connections so far: the copies sync again after each
	cursor    atomic.Uint64
	published atomic.Uint64
	core      atomic.Uint64
	dropped   atomic.Uint64
	errs      atomic.Uint64
	mu        sync.Mutex
	lastErr   string
	auditErr  string
	refused   string
	histErr   string
	alarmErr  string

	histPublished  atomic.Uint64
	alarmPublished atomic.Uint64
	onConnect      []func(*nats.Conn) // OnConnect's (set before Start)
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
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 5 * time.Second
	}
	if cfg.HistoryStream == "" {
		cfg.HistoryStream = manifest.DefaultFleetHistoryStream
	}
	if cfg.AlarmStream == "" {
		cfg.AlarmStream = manifest.DefaultFleetAlarmStream
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	base := cfg.Prefix + "." + cfg.Site + "." + cfg.DeviceID
	life, endLife := context.WithCancel(context.Background())
	return &Uplink{cfg: cfg, log: cfg.Logger.With("component", "fleet"), base: base, subject: base + ".audit",
		nudge: make(chan struct{}, 1), stop: make(chan struct{}), life: life, endLife: endLife}, nil
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
		// The site's own inbox: the hub lets only this site hear the
		// replies to it (hub.SiteInbox, hub.SitePermissions).
		nats.CustomInboxPrefix(hub.SiteInbox(u.cfg.Site)),
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
			// The audit subject itself, or the direct get of its last
			// record (the subject ends the request's).
			var refusal string
			switch {
			case !errors.Is(err, nats.ErrPermissionViolation):
				return
			case strings.Contains(err.Error(), u.subject+`"`):
				refusal = "fleet: the hub refuses this gateway's audit subject; fix: credentials for this site, or the site they are for in network.fleet.site"
			case strings.Contains(err.Error(), `Subscription to "`+hub.SiteInbox(u.cfg.Site)+"."):
				// Its inbox: no reply of the hub can reach it.
				refusal = "fleet: the hub refuses this gateway's inbox, " + hub.SiteInbox(u.cfg.Site) + ".>; fix: credentials for this site (or the site they are for in network.fleet.site), " +
					"or give the site's user the subscribe permission " + hub.SiteInbox(u.cfg.Site) + ".> in place of _INBOX.> (hub.SitePermissions)"
			default:
				return
			}
			u.mu.Lock()
			u.refused = err.Error()
			u.mu.Unlock()
			u.log.Error(refusal, "err", err.Error())
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
			if js, err = u.jetStream(nc); err == nil {
				u.js = js
				u.audit = chain{life: u.life, js: js, nc: nc, subject: u.subject, timeout: u.cfg.PublishTimeout, window: u.cfg.Window}
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

// jetStream is the hub's JetStream: by its domain when one is set.
func (u *Uplink) jetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	if u.cfg.Domain != "" {
		return jetstream.NewWithDomain(nc, u.cfg.Domain)
	}
	return jetstream.New(nc)
}

func (u *Uplink) onConnected(nc *nats.Conn) {
	u.connected.Store(true)
	u.synced.Store(false)
	u.conns.Add(1)
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
			u.note(&u.auditErr, "audit", "fleet: audit records not published yet; retrying", err, "cursor", u.cursor.Load())
			backoff = time.Now().Add(u.cfg.ReconnectWait)
		}
	}
}

// note records a path's error (what, and *field for /status) and logs it
// once: the same error retried every second is logged the first time.
// A nil err clears the field.
func (u *Uplink) note(field *string, what, msg string, err error, attrs ...any) {
	if err == nil {
		u.mu.Lock()
		*field = ""
		u.mu.Unlock()
		return
	}
	u.fail(what, err)
	u.mu.Lock()
	again := *field == err.Error()
	*field = err.Error()
	u.mu.Unlock()
	if !again {
		u.log.Warn(msg, append([]any{"err", err.Error()}, attrs...)...)
	}
}

// sync asks the stream for the last record it holds for this device.
func (u *Uplink) sync() error {
	create := AuditStreamConfig(u.cfg.Stream, u.cfg.Prefix, 1)
	msg, err := u.audit.sync(u.cfg.Stream, &create)
	if err != nil {
		return err
	}
	if msg == nil {
		u.cursor.Store(0)
		u.synced.Store(true)
		return nil
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
	u.cursor.Store(seq)
	u.synced.Store(true)
	return nil
}

var errStop = errors.New("stop")

// drain publishes the local records after the cursor, in batches of the
// chain's window, each acknowledged before the next.
func (u *Uplink) drain() error {
	var stuck resyncs
	for gaps := 0; ; {
		if !u.synced.Load() {
			if err := u.sync(); err != nil {
				return err
			}
			if err := stuck.check(int64(u.cursor.Load()), u.subject, u.msgID("<seq>")); err != nil {
				return err
			}
		}
		var b batch
		err := u.al.ReadAfter(u.cursor.Load(), func(seq uint64, line []byte) error {
			select {
			case <-u.stop:
				return errStop
			default:
			}
			b.add(seq, u.auditMsg(seq, line))
			if b.full(u.audit.limit()) {
				return u.publish(&b)
			}
			return nil
		})
		var gap *audit.ErrGap
		if err == nil || errors.As(err, &gap) {
			// The records read before the end (or before the gap).
			if perr := u.publish(&b); perr != nil {
				err = perr
			}
		}
		if errors.Is(err, errResync) {
			stuck.failed(int64(u.cursor.Load()))
			continue
		}
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

// msgID is a Nats-Msg-Id of this gateway: <site>/<device>/<rest>. The
// stream deduplicates by it across every subject, and device ids are
// unique within a site only.
func (u *Uplink) msgID(rest string) string { return u.cfg.Site + "/" + u.cfg.DeviceID + "/" + rest }

// auditMsg is the stream message of one audit record.
func (u *Uplink) auditMsg(seq uint64, line []byte) *nats.Msg {
	var ev struct {
		Event string `json:"event"`
	}
	_ = json.Unmarshal(line, &ev)
	m := nats.NewMsg(u.subject)
	m.Data = append([]byte(nil), line...) // ReadAfter reuses its buffer
	m.Header.Set(jetstream.MsgIDHeader, u.msgID(strconv.FormatUint(seq, 10)))
	m.Header.Set(HeaderSeq, strconv.FormatUint(seq, 10))
	m.Header.Set(HeaderDevice, u.cfg.DeviceID)
	if ev.Event != "" {
		m.Header.Set(HeaderEvent, ev.Event)
	}
	return m
}

// batch is the records read and not yet sent.
type batch struct {
	msgs  []*nats.Msg
	first uint64 // the first record's seq
	last  uint64
	bytes int
}

func (b *batch) add(seq uint64, m *nats.Msg) {
	if len(b.msgs) == 0 {
		b.first = seq
	}
	b.msgs = append(b.msgs, m)
	b.last = seq
	b.bytes += len(m.Data)
}

func (b *batch) full(limit int) bool { return len(b.msgs) >= limit || b.bytes >= maxBatchBytes }

func (b *batch) reset() { *b = batch{} }

// publish sends the batch; the cursor moves past it once it is stored.
func (u *Uplink) publish(b *batch) error {
	if len(b.msgs) == 0 {
		return nil
	}
	n, err := u.audit.send(b.msgs)
	u.log.Debug("fleet: audit records sent", "first", b.first, "last", b.last, "stored", n, "batch", u.audit.batchable() && len(b.msgs) > 1, "err", err)
	if n > 0 {
		u.cursor.Store(b.first + uint64(n) - 1)
		u.published.Add(uint64(n))
	}
	if errors.Is(err, errResync) {
		u.synced.Store(false)
		return errResync
	}
	if err != nil {
		// Unknown whether it landed: the next sync reads the stream.
		u.synced.Store(false)
		if b.first == b.last {
			return fmt.Errorf("audit seq %d: %w", b.first, err)
		}
		return fmt.Errorf("audit seqs %d-%d: %w", b.first, b.last, err)
	}
	if u.auditErrSet() {
		u.mu.Lock()
		u.auditErr = ""
		u.mu.Unlock()
	}
	b.reset()
	return nil
}

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
	b, err := o.Obs.JSON()
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
		Published: u.published.Load(), Core: u.core.Load(), Dropped: u.dropped.Load(), Errors: u.errs.Load(),
		HistoryPublished: u.histPublished.Load(), AlarmsPublished: u.alarmPublished.Load()}
	if u.al != nil {
		s.Local = u.al.Seq()
	}
	if s.Local > s.Cursor {
		s.Pending = s.Local - s.Cursor
	}
	u.mu.Lock()
	s.LastError, s.AuditError, s.Refused, s.HistoryError, s.AlarmsError = u.lastErr, u.auditErr, u.refused, u.histErr, u.alarmErr
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
		u.endLife()
		u.done.Wait()
		if nc := u.nc.Load(); nc != nil {
			_ = nc.FlushTimeout(time.Second)
			nc.Close()
		}
	})
}
