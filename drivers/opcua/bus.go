package opcua

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

func init() {
	drivers.RegisterDriver("opcua", drivers.Driver{Open: Open, Check: CheckBinding, Span: BindingSpan, CheckBus: CheckBus})
}

// Bus is one OPC UA server endpoint: one secure channel and one session,
// shared by every capability bound to it. A session that fails (the
// server restarted, the network dropped) is closed and a new one is made
// by the next read or write, no sooner than reconnect_backoff_ms after the
// last failed attempt, each attempt bounded by connect_timeout_ms.
type Bus struct {
	spec *busSpec
	log  *slog.Logger

	mu      sync.Mutex
	client  *opcua.Client
	gen     uint64        // the session's generation: bumps at each connect
	dialing chan struct{} // closed when the connect under way ends; nil: none
	lastErr error         // why there is no session (nil before the first attempt)
	lastTry time.Time     // when the last failed connect ended
	closed  bool
	mon     *monitorSet // the monitored items (monitor.go); nil until the first
	// trusted is the session proven alive after gopcua marked it not
	// Connected (usable): its state says nothing from then on.
	trusted *opcua.Client
	// idle is closed when the session ends: its keep-alive stops
	// (keepSession).
	idle chan struct{}
}

var _ drivers.Bus = (*Bus)(nil)

// Open is the drivers.Factory for bus type "opcua". It does not wait for
// the server: the first connect starts in the background, and a server
// that is down is reported by Health and by every read until it answers.
func Open(_ context.Context, b *manifest.Bus) (drivers.Bus, error) {
	if b == nil {
		return nil, errors.New("opcua: nil bus")
	}
	spec, err := parseBus(b)
	if err != nil {
		return nil, err
	}
	if spec.ApplicationURI == "" {
		spec.ApplicationURI = defaultApplicationURI()
	}
	if spec.Policy != PolicyNone && spec.cert == nil {
		cert, key, err := generateCert(spec.ApplicationURI)
		if err != nil {
			return nil, fmt.Errorf("opcua bus %q: generating an application certificate: %w", b.Name, err)
		}
		spec.cert, spec.key = cert, key
		slog.Info("opcua: generated an application instance certificate; the server must trust it (or give certificate: and private_key:)",
			"bus", b.Name, "sha256", fingerprint(cert))
	}
	bus := &Bus{spec: spec, log: slog.Default().With("bus", b.Name)}
	bus.mu.Lock()
	bus.startDialLocked()
	bus.mu.Unlock()
	return bus, nil
}

// CheckBus validates an opcua bus entry offline (its keys, and the
// certificate files it names), for `physd validate`.
func CheckBus(b *manifest.Bus) error {
	_, err := parseBus(b)
	return err
}

// Point binds a capability to its node.
func (b *Bus) Point(c *manifest.Capability) (drivers.Point, error) {
	if c == nil {
		return nil, errors.New("opcua: nil capability")
	}
	s, err := parseBinding(c)
	if err != nil {
		return nil, err
	}
	return &point{bus: b, spec: s}, nil
}

// Health is nil while the bus has a session; otherwise it says why not.
func (b *Bus) Health() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return fmt.Errorf("opcua %s: bus closed: %w", b.spec.name, drivers.ErrOffline)
	case b.client != nil && (b.client.State() == opcua.Connected || b.trusted == b.client):
		return nil
	case b.client != nil:
		return fmt.Errorf("opcua %s: the session to %s is %s; reconnecting on the next read: %w", b.spec.name, b.spec.Endpoint, b.client.State(), drivers.ErrOffline)
	case b.lastErr != nil:
		return fmt.Errorf("opcua %s: %w: %w", b.spec.name, b.lastErr, drivers.ErrOffline)
	}
	return fmt.Errorf("opcua %s: connecting to %s: %w", b.spec.name, b.spec.Endpoint, drivers.ErrOffline)
}

// Close ends the session and the secure channel. Later reads and writes
// fail with drivers.ErrOffline. It is idempotent.
func (b *Bus) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	c, ms := b.client, b.mon
	b.client = nil
	b.endIdleLocked()
	b.mu.Unlock()
	if ms != nil {
		ms.close(c) // its subscriptions are deleted from the server
	}
	if c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), b.spec.Timeout)
		defer cancel()
		_ = c.Close(ctx)
	}
	return nil
}

// session returns the bus's session, connecting when there is none and
// the backoff since the last failure has passed. It waits for a connect
// under way no longer than ctx allows. Errors wrap drivers.ErrOffline:
// nothing was sent.
func (b *Bus) session(ctx context.Context) (*opcua.Client, uint64, error) {
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return nil, 0, fmt.Errorf("opcua %s: bus closed: %w", b.spec.name, drivers.ErrOffline)
		}
		if b.client != nil {
			c, g, trusted := b.client, b.gen, b.trusted == b.client
			b.mu.Unlock()
			if trusted || c.State() == opcua.Connected || b.usable(ctx, c) {
				return c, g, nil
			}
			b.drop(g, fmt.Errorf("the session to %s ended (%s)", b.spec.Endpoint, c.State()))
			continue
		}
		ch := b.dialing
		if ch == nil {
			if wait := b.spec.Reconnect - time.Since(b.lastTry); b.lastErr != nil && wait > 0 {
				err := b.lastErr
				b.mu.Unlock()
				return nil, 0, fmt.Errorf("opcua %s: no session (%w); next attempt in %v: %w", b.spec.name, err, wait.Round(time.Millisecond), drivers.ErrOffline)
			}
			ch = b.startDialLocked()
		}
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("opcua %s: connecting to %s: %v: %w", b.spec.name, b.spec.Endpoint, ctx.Err(), drivers.ErrOffline)
		}
		b.mu.Lock()
		c, g, err := b.client, b.gen, b.lastErr
		b.mu.Unlock()
		if c == nil {
			if err == nil {
				err = errors.New("no session")
			}
			return nil, 0, fmt.Errorf("opcua %s: %w: %w", b.spec.name, err, drivers.ErrOffline)
		}
		return c, g, nil
	}
}

// usable asks a session gopcua no longer calls Connected whether it still
// answers (a Read of the server's state within timeout_ms), and trusts it
// from then on when it does. gopcua marks a client Closed, and stops
// watching it, on any ServiceFault the server sends — a refused
// TransferSubscriptions or Republish, a Read refused as a whole — not only
// when its channel breaks; a broken channel fails the Read at once. A
// trusted session is dropped as any other: when a call gets no usable
// reply.
func (b *Bus) usable(ctx context.Context, c *opcua.Client) bool {
	if !b.answers(ctx, c) {
		return false
	}
	b.trust(c)
	return true
}

// answers reports whether c answers a Read of the server's state within
// timeout_ms.
func (b *Bus) answers(ctx context.Context, c *opcua.Client) bool {
	ctx, cancel := b.call(ctx)
	defer cancel()
	_, err := c.Read(ctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus_State), AttributeID: ua.AttributeIDValue}},
		TimestampsToReturn: ua.TimestampsToReturnNeither})
	return err == nil
}

// writeSession is the session a write goes through. A trusted session is
// one nobody watches (gopcua gave it up): its channel may have died
// unnoticed (a server restart), and a write sent into it would end in an
// unknown outcome. So it is asked first, and replaced when it does not
// answer: the write then goes to a new session, or is refused unsent.
func (b *Bus) writeSession(ctx context.Context) (*opcua.Client, uint64, error) {
	c, gen, err := b.session(ctx)
	if err != nil {
		return nil, 0, err
	}
	b.mu.Lock()
	trusted := b.trusted == c
	b.mu.Unlock()
	if !trusted || b.answers(ctx, c) {
		return c, gen, nil
	}
	b.drop(gen, fmt.Errorf("the session to %s did not answer before a write", b.spec.Endpoint))
	return b.session(ctx)
}

// answered settles the session after a call that failed with err: one
// without a usable reply (or whose status ends the session) is dropped;
// one the server refused with a ServiceFault is alive, and trusted,
// since gopcua gives a client up on any ServiceFault.
func (b *Bus) answered(c *opcua.Client, gen uint64, err error) {
	if sessionLost(err) {
		b.drop(gen, err)
		return
	}
	b.trust(c)
}

// trust makes c, when it is still the bus's session, one whose gopcua
// state says nothing (it answered after gopcua gave it up).
func (b *Bus) trust(c *opcua.Client) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.client == c {
		b.trusted = c
	}
}

// retryIn is how long until the next connect may start (0: now).
func (b *Bus) retryIn() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.client != nil || b.dialing != nil || b.lastErr == nil {
		return 0
	}
	return b.spec.Reconnect - time.Since(b.lastTry)
}

// call bounds one service call by timeout_ms (the session's own request
// timeout is wider: it must let a Publish request wait for its
// keep-alive).
func (b *Bus) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.spec.Timeout)
}

// startDialLocked starts a connect in the background (b.mu held). Its
// deadline is connect_timeout_ms, whoever waits for it.
func (b *Bus) startDialLocked() chan struct{} {
	ch := make(chan struct{})
	b.dialing = ch
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), b.spec.ConnectTimeout)
		defer cancel()
		c, err := b.connect(ctx)
		b.mu.Lock()
		b.dialing = nil
		switch {
		case b.closed && c != nil:
			go func() { _ = c.Close(context.Background()) }()
		case err != nil:
			b.lastErr, b.lastTry = err, time.Now()
			b.log.Warn("opcua: connect failed", "endpoint", b.spec.Endpoint, "err", err)
		default:
			b.client, b.lastErr = c, nil
			b.gen++
			b.idle = make(chan struct{})
			go b.keepSession(c, b.gen, b.idle)
			b.log.Info("opcua: session open", "endpoint", b.spec.Endpoint, "policy", b.spec.Policy, "mode", b.spec.Mode)
		}
		b.mu.Unlock()
		close(ch)
	}()
	return ch
}

// drop closes the session of generation gen (if it is still the bus's),
// so the next call reconnects. Reads of a dropped session's values are
// never served: a value is only ever returned by the read that fetched it.
func (b *Bus) drop(gen uint64, why error) {
	b.mu.Lock()
	if b.client == nil || b.gen != gen {
		b.mu.Unlock()
		return
	}
	c := b.client
	b.client, b.lastErr, b.lastTry = nil, why, time.Now()
	b.endIdleLocked()
	b.mu.Unlock()
	b.log.Warn("opcua: session dropped", "endpoint", b.spec.Endpoint, "err", why)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = c.Close(ctx)
	}()
}

// keepSession keeps the session of generation gen open while nothing
// else is asked of it. A server ends a session that sends no request
// within its revised session timeout (OPC UA Part 4 §5.6.2: physd asks
// for a minute, a PLC may grant seconds), and the first read or write
// after a quiet spell would then meet BadSessionIdInvalid: a read of the
// server's state every third of the revised timeout keeps it. A session
// that gives no usable reply to it is dropped, so Health says so before
// anyone reads. It returns when idle is closed (the session ended).
func (b *Bus) keepSession(c *opcua.Client, gen uint64, idle chan struct{}) {
	every := sessionTimeout
	if s := c.Session(); s != nil && s.RevisedTimeout() > 0 {
		every = s.RevisedTimeout()
	}
	t := time.NewTicker(max(every/3, minSessionPing))
	defer t.Stop()
	for {
		select {
		case <-idle:
			return
		case <-t.C:
		}
		ctx, cancel := b.call(context.Background())
		_, err := c.Read(ctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus_State), AttributeID: ua.AttributeIDValue}},
			TimestampsToReturn: ua.TimestampsToReturnNeither})
		cancel()
		if err != nil && sessionLost(err) {
			b.drop(gen, fmt.Errorf("the session to %s did not answer its keep-alive read: %w", b.spec.Endpoint, err))
			return
		}
	}
}

const (
	// sessionTimeout is the session timeout physd asks for.
	sessionTimeout = time.Minute
	// minSessionPing bounds the keep-alive reads of a session whose
	// server revised its timeout to almost nothing.
	minSessionPing = 100 * time.Millisecond
)

// endIdleLocked stops the keep-alive of the bus's session (b.mu held).
func (b *Bus) endIdleLocked() {
	if b.idle != nil {
		close(b.idle)
		b.idle = nil
	}
}

// connect opens a secure channel and a session. The endpoint list is read
// first: it carries the server certificate, which must be the pinned one,
// and the user token policy the identity is sent under.
func (b *Bus) connect(ctx context.Context) (*opcua.Client, error) {
	s := b.spec
	eps, err := opcua.GetEndpoints(ctx, s.Endpoint, opcua.DialTimeout(s.ConnectTimeout), opcua.RequestTimeout(s.Timeout+publishHoldMax))
	if err != nil {
		return nil, fmt.Errorf("reading the endpoints of %s: %w", s.Endpoint, err)
	}
	var ep *ua.EndpointDescription
	var offered []string
	for _, e := range eps {
		pol := policyName(e.SecurityPolicyURI)
		offered = append(offered, pol+"/"+modeName(e.SecurityMode))
		if pol == s.Policy && modeName(e.SecurityMode) == s.Mode {
			ep = e
		}
	}
	if ep == nil {
		return nil, fmt.Errorf("%s offers no endpoint with security_policy %s and security_mode %s (it offers %v)", s.Endpoint, s.Policy, s.Mode, offered)
	}
	var serverCert []byte
	if s.Policy != PolicyNone {
		if serverCert, err = s.checkServerCert(ep.ServerCertificate); err != nil {
			return nil, err
		}
	}
	tokenType := ua.UserTokenTypeAnonymous
	opts := []opcua.Option{
		opcua.AutoReconnect(false),
		opcua.DialTimeout(s.ConnectTimeout),
		opcua.RequestTimeout(s.Timeout + publishHoldMax),
		opcua.ApplicationName("physd"),
		opcua.SessionName("physd " + s.name),
		opcua.SessionTimeout(sessionTimeout),
	}
	if s.ApplicationURI != "" {
		opts = append(opts, opcua.ApplicationURI(s.ApplicationURI))
	}
	if s.userCert != nil {
		tokenType = ua.UserTokenTypeCertificate
		opts = append(opts, opcua.AuthCertificate(s.userCert), opcua.AuthPrivateKey(s.userKey))
	} else if s.Username != "" {
		pw, err := s.password()
		if err != nil {
			return nil, err
		}
		tokenType = ua.UserTokenTypeUserName
		opts = append(opts, opcua.AuthUsername(s.Username, pw))
	} else {
		opts = append(opts, opcua.AuthAnonymous())
	}
	var tokens []string
	offers := false
	for _, tok := range ep.UserIdentityTokens {
		tokens = append(tokens, tok.TokenType.String())
		offers = offers || tok.TokenType == tokenType
	}
	if !offers {
		return nil, &certError{msg: fmt.Sprintf("the endpoint %s/%s of %s takes no %s identity (it takes %v)", s.Policy, s.Mode, s.Endpoint, tokenType, tokens),
			code: "identity_not_offered", fix: "use an identity the server offers: username/password_env, user_certificate/user_private_key, or none (anonymous)"}
	}
	opts = append(opts, opcua.SecurityFromEndpoint(ep, tokenType))
	if s.Policy != PolicyNone {
		opts = append(opts, opcua.Certificate(s.cert), opcua.PrivateKey(s.key), opcua.RemoteCertificate(serverCert))
	}
	c, err := opcua.NewClient(s.Endpoint, opts...)
	if err != nil {
		return nil, err
	}
	if err := c.Connect(ctx); err != nil {
		_ = c.Close(context.Background())
		var st ua.StatusCode
		if errors.As(err, &st) {
			return nil, &statusError{what: "a session with " + s.Endpoint, status: st, op: "connect"}
		}
		return nil, fmt.Errorf("connecting to %s: %w", s.Endpoint, err)
	}
	return c, nil
}

// certError is a server that presents another certificate than the one
// pinned: nothing is sent to it.
type certError struct{ msg, code, fix string }

func (e *certError) Error() string { return e.msg }
func (e *certError) Code() string {
	if e.code != "" {
		return e.code
	}
	return "server_certificate_mismatch"
}
func (e *certError) Fix() string {
	if e.fix != "" {
		return e.fix
	}
	return "check that the endpoint is the intended server; if its certificate was renewed, copy the new one to server_certificate (or add its issuer to server_trust)"
}

// checkServerCert judges the certificate an endpoint presents (DER, or a
// chain whose first certificate is the server's): it must be the pinned
// one, or chain to server_trust. It returns the server's DER.
func (s *busSpec) checkServerCert(b []byte) ([]byte, error) {
	chain, err := x509.ParseCertificates(b)
	if err != nil || len(chain) == 0 {
		return nil, &certError{msg: fmt.Sprintf("the server's endpoint carries no readable certificate (%v): refusing to connect", err)}
	}
	leaf := chain[0]
	if s.trust == nil {
		if !bytes.Equal(leaf.Raw, s.serverCert) {
			return nil, &certError{msg: fmt.Sprintf("the server's certificate (sha256 %s) is not the pinned server_certificate %s (sha256 %s): refusing to connect",
				fingerprint(leaf.Raw), s.ServerCertFile, fingerprint(s.serverCert))}
		}
		return leaf.Raw, nil
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: s.trust, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, &certError{msg: fmt.Sprintf("the server's certificate (sha256 %s, subject %q) is not trusted by server_trust %v: %v: refusing to connect",
			fingerprint(leaf.Raw), leaf.Subject.String(), s.ServerTrust, err)}
	}
	return leaf.Raw, nil
}

func policyName(uri string) string {
	const prefix = "http://opcfoundation.org/UA/SecurityPolicy#"
	if len(uri) > len(prefix) && uri[:len(prefix)] == prefix {
		return uri[len(prefix):]
	}
	return uri
}

func modeName(m ua.MessageSecurityMode) string {
	switch m {
	case ua.MessageSecurityModeNone:
		return ModeNone
	case ua.MessageSecurityModeSign:
		return ModeSign
	case ua.MessageSecurityModeSignAndEncrypt:
		return ModeSignAndEncrypt
	}
	return m.String()
}
