package opcua

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"gopkg.in/yaml.v3"

	"github.com/physd/physd/manifest"
)

// Scanning (physd scan opcua): connect as an opcua bus does, browse the
// address space from the Objects folder (or a given root) along its
// hierarchical references, and read what a manifest needs of every
// variable: DataType (resolved to its built-in type through HasSubtype),
// ValueRank and ArrayDimensions, AccessLevel and UserAccessLevel, the
// EURange and EngineeringUnits properties (OPC UA Part 8), DisplayName,
// Description and the value at scan time. A scan sends only GetEndpoints,
// session, Browse, BrowseNext and Read requests; it never writes.
//
// Every request is bounded by the bus's timeout_ms and by what is left of
// the scan's timeout; the browse stops at 70 % of it so that the nodes found
// can still be read. Depth, node count and time limits that were reached
// are reported, with what they left out.

// ScanBus is the bus a scan connects with: the keys of an opcua bus entry
// (paths absolute or relative to the working directory). The skeleton
// writes the same entry.
type ScanBus struct {
	Endpoint          string
	SecurityPolicy    string
	SecurityMode      string
	Certificate       string
	PrivateKey        string
	ServerCertificate string
	ServerTrust       []string
	ApplicationURI    string
	Username          string
	PasswordEnv       string
	UserCertificate   string
	UserPrivateKey    string
	TimeoutMS         int
	ConnectTimeoutMS  int
}

// entries are the bus keys that are set, in the manifest's order.
func (b ScanBus) entries() []busEntry {
	var out []busEntry
	str := func(key, v string) {
		if v != "" {
			out = append(out, busEntry{key: key, value: v})
		}
	}
	str("endpoint", b.Endpoint)
	str("security_policy", b.SecurityPolicy)
	str("security_mode", b.SecurityMode)
	str("server_certificate", b.ServerCertificate)
	if b.ServerTrust != nil {
		out = append(out, busEntry{key: "server_trust", list: b.ServerTrust, path: true})
	}
	str("certificate", b.Certificate)
	str("private_key", b.PrivateKey)
	str("application_uri", b.ApplicationURI)
	str("username", b.Username)
	str("password_env", b.PasswordEnv)
	str("user_certificate", b.UserCertificate)
	str("user_private_key", b.UserPrivateKey)
	for i := range out {
		switch out[i].key {
		case "server_certificate", "certificate", "private_key", "user_certificate", "user_private_key":
			out[i].path = true
		}
	}
	if b.TimeoutMS != 0 {
		out = append(out, busEntry{key: "timeout_ms", value: fmt.Sprint(b.TimeoutMS), number: true})
	}
	if b.ConnectTimeoutMS != 0 {
		out = append(out, busEntry{key: "connect_timeout_ms", value: fmt.Sprint(b.ConnectTimeoutMS), number: true})
	}
	return out
}

// busEntry is one key of a bus entry: a string, a number or a list.
type busEntry struct {
	key    string
	value  string
	list   []string
	number bool
	path   bool // a file name: relative to the manifest's folder
}

// spec validates the bus as a manifest's opcua bus entry is validated
// (parseBus: the same checks, defaults and files), under the name bus;
// a secured bus may leave the server certificate to the scan (PinSHA256).
func (b ScanBus) spec(bus string) (*busSpec, error) {
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	add := func(k string, v *yaml.Node) {
		m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, v)
	}
	add("type", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "opcua"})
	for _, e := range b.entries() {
		switch {
		case e.list != nil:
			seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
			for _, s := range e.list {
				seq.Content = append(seq.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s})
			}
			add(e.key, seq)
		case e.number:
			add(e.key, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: e.value})
		default:
			add(e.key, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: e.value})
		}
	}
	return parseBusEntry(&manifest.Bus{Name: bus, Type: "opcua", Config: m, Pos: manifest.Pos{File: "scan"}}, true)
}

// ScanOptions configure Scan; DefaultScanOptions has the defaults.
type ScanOptions struct {
	Bus      ScanBus
	BusName  string        // the bus's name in messages and the skeleton; default plc
	Root     string        // the node to browse from (a binding's node id forms); "": the Objects folder
	Depth    int           // reference levels followed below Root
	MaxNodes int           // objects, variables and methods recorded at most
	Timeout  time.Duration // bound on the whole scan, connect included
	// MaxReferencesPerNode is the Browse request's RequestedMaxReferencesPerNode
	// (default 1000): a node with more references is continued with
	// BrowseNext. Tests lower it to make every node need BrowseNext.
	MaxReferencesPerNode uint32
	// PinSHA256 accepts the certificate a secured server presents when
	// its SHA-256 is this (hex, colons allowed), for a bus that names no
	// server_certificate or server_trust: the person scanning compared it
	// with the one the server shows. The report carries the certificate
	// (ServerCertificate) for the skeleton to pin.
	PinSHA256 string
	Progress  io.Writer // a few lines on how the scan goes; nil: none
}

// Defaults of ScanOptions: six levels below Objects reach the tags of
// most PLCs (Objects/PLC/Program/Block/Struct/Tag); 5000 nodes and 30 s
// bound a scan of a large server to a skeleton a person can still read.
const (
	DefaultScanDepth    = 6
	DefaultScanMaxNodes = 5000
	DefaultScanTimeout  = 30 * time.Second
)

// DefaultScanOptions are the options of a scan of endpoint with the
// defaults.
func DefaultScanOptions(endpoint string) ScanOptions {
	return ScanOptions{Bus: ScanBus{Endpoint: endpoint}, Depth: DefaultScanDepth, MaxNodes: DefaultScanMaxNodes, Timeout: DefaultScanTimeout}
}

// CheckScanOptions validates o before anything is sent: the bus entry as
// a manifest's would be validated, the root node id and the limits.
func CheckScanOptions(o ScanOptions) error {
	_, err := checkScan(&o)
	return err
}

func checkScan(o *ScanOptions) (*busSpec, error) {
	if o.BusName == "" {
		o.BusName = "plc"
	}
	if o.MaxReferencesPerNode == 0 {
		o.MaxReferencesPerNode = 1000
	}
	var errs []error
	if o.Depth < 1 || o.Depth > 64 {
		errs = append(errs, scanErr("depth", "", fmt.Sprintf("depth must be 1..64, got %d", o.Depth), "e.g. 6 levels below the root"))
	}
	if o.MaxNodes < 1 || o.MaxNodes > 1_000_000 {
		errs = append(errs, scanErr("max_nodes", "", fmt.Sprintf("max_nodes must be 1..1000000, got %d", o.MaxNodes), "e.g. 5000"))
	}
	if o.Timeout < time.Second {
		errs = append(errs, scanErr("timeout", "", fmt.Sprintf("timeout must be at least 1s, got %v", o.Timeout), "e.g. 30s, or 5m for a large server"))
	}
	if o.PinSHA256 != "" {
		sum := normalizeSHA256(o.PinSHA256)
		switch {
		case len(sum) != 64 || strings.Trim(sum, "0123456789abcdef") != "":
			errs = append(errs, scanErr("server_sha256", "", fmt.Sprintf("server_sha256 %q is not a SHA-256 (64 hex digits)", o.PinSHA256), "copy the fingerprint the scan printed, or the one the server shows"))
		case policyOr(o.Bus.SecurityPolicy) == PolicyNone:
			errs = append(errs, scanErr("server_sha256", "", "server_sha256 applies to a secured bus; security_policy is None", "add security_policy: Basic256Sha256, or remove server_sha256"))
		case o.Bus.ServerCertificate != "" || o.Bus.ServerTrust != nil:
			errs = append(errs, scanErr("server_sha256", "", "server_sha256 with server_certificate or server_trust", "pin one way: server_sha256 (the scan saves the certificate), server_certificate or server_trust"))
		}
	}
	if o.Root != "" {
		if _, err := parseNodeID(o.Root); err != nil {
			errs = append(errs, scanErr("root", "", err.Error(), "give the node to browse from as a binding's node is written: i=85, ns=2;s=Line1 or nsu=urn:plant;s=Line1"))
		}
	}
	spec, err := o.Bus.spec(o.BusName)
	if err != nil {
		errs = append(errs, err)
	}
	return spec, errors.Join(errs...)
}

// ScanError is a scan that could not go on (or a bad option): what
// happened, the bus key or scan option to change (Key: "security_policy",
// "root"; "" when it is the server's side) and what to do (Fix).
type ScanError struct {
	Key            string
	code, msg, fix string
}

func scanErr(key, code, msg, fix string) *ScanError {
	return &ScanError{Key: key, code: code, msg: msg, fix: fix}
}

func (e *ScanError) Error() string { return e.msg }

// Code is a short name of what went wrong (unreachable,
// security_not_offered, server_certificate_unknown, a status name …).
func (e *ScanError) Code() string { return e.code }

// Fix says what to do.
func (e *ScanError) Fix() string { return e.fix }

// ScanReport is what a scan found.
type ScanReport struct {
	Bus          ScanBus // as connected: the skeleton's bus entry
	BusName      string
	Identity     string // anonymous, user NAME, user certificate
	Namespaces   []string
	ServerSHA256 string // the server certificate's fingerprint, on a secured bus
	// OperationLimits are the limits the server publishes (0: none); the
	// scan's batches kept within them.
	OperationLimits struct{ MaxNodesPerBrowse, MaxNodesPerRead, MaxBrowseContinuationPoints int }
	// ServerCertificate is the server's certificate (DER) pinned by
	// PinSHA256: to be saved, and named in Bus.ServerCertificate, before
	// the skeleton is written.
	ServerCertificate []byte
	Root              string // as written: i=85 for the Objects folder
	RootPath          string // the root's browse name
	Variables         []*ScannedVariable
	Methods           []*ScannedNode
	NotBrowsed        []*ScannedNode // namespace-0 nodes under Objects (the Server object) left out on purpose
	Limits            []string       // each limit reached and what it left out
	Notes             []string
	Nodes             int // objects, variables and methods recorded
	Requests          int
	Elapsed           time.Duration
	Options           ScanOptions // as used, defaults filled in
}

// ScannedNode is a node the scan found: its node id as a binding writes it
// and its browse path from the root.
type ScannedNode struct {
	NodeID   string   // nsu=<uri>;… (ns=<index>;… only where NodeNote says why)
	NodeNote string   // why the node id is not in the nsu= form, or cannot be bound
	Path     []string // browse names from the root (the root excluded)
	order    []int    // the position among its parent's references, at each level
}

// PathString is the browse path, joined with "/".
func (n *ScannedNode) PathString() string { return strings.Join(n.Path, "/") }

// ScannedVariable is a variable node with what the skeleton needs of it.
type ScannedVariable struct {
	ScannedNode
	DisplayName string
	Description string
	// DataType is the built-in type the node's DataType resolves to
	// (Double, Int16, DateTime, LocalizedText …); "" when it could not be
	// resolved. TypeName is the DataType node's own name when it is not
	// a built-in type (Duration, ServerState); TypeClass says what kind of
	// type it is.
	DataType  string
	TypeName  string
	TypeClass string // builtin, enumeration, structure, abstract, unknown
	ValueRank int32
	ArrayDims []uint32
	// AccessLevel and UserAccessLevel are the attributes' bits (Part 3
	// §8.57): CurrentRead 0x01, CurrentWrite 0x02.
	AccessLevel, UserAccessLevel byte
	MinSamplingMS                float64 // MinimumSamplingInterval; -1 when not published
	EURange                      *EURange
	Units                        *EngineeringUnits
	EnumStrings                  []string
	Value                        any    // the value at scan time (a scalar or a slice); nil if none
	ValueType                    string // the value's built-in type at scan time
	Status                       string // the value's status code name when it was not Good
	Unread                       string // why the attributes were not read (time ran out); "" when read
	AccessNote                   string // how missing access level attributes were taken
}

// EURange is the EURange property (Part 8 AnalogItemType).
type EURange struct{ Low, High float64 }

// EngineeringUnits is the EngineeringUnits property (Part 8 EUInformation).
type EngineeringUnits struct {
	NamespaceURI string
	UnitID       int32
	DisplayName  string
	Description  string
}

// Readable says whether this identity may read the value.
func (v *ScannedVariable) Readable() bool { return v.UserAccessLevel&0x01 != 0 }

// Writable says whether this identity may write the value.
func (v *ScannedVariable) Writable() bool { return v.UserAccessLevel&0x02 != 0 }

// scanner runs one scan.
type scanner struct {
	o        ScanOptions
	spec     *busSpec
	c        *opcua.Client
	rep      *ScanReport
	browseBy time.Time // the browse stops here
	deadline time.Time // the scan's end
	ctx      context.Context

	maxBrowse, maxRead int
	visited            map[string]bool // node ids (this session's ns= form) met
	vars               []*node         // the variables found, in the skeleton's order
}

// Scan connects to the server of o.Bus, browses it and reads its
// variables. It errors when the server cannot be used at all (unreachable,
// a security mode it does not offer, a certificate not trusted, an
// identity refused, a root that does not exist); limits reached are in the
// report.
func Scan(ctx context.Context, o ScanOptions) (*ScanReport, error) {
	spec, err := checkScan(&o)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	s := &scanner{o: o, spec: spec, ctx: ctx, deadline: start.Add(o.Timeout), browseBy: start.Add(o.Timeout * 7 / 10),
		visited: map[string]bool{}, maxBrowse: defaultBrowseBatch, maxRead: defaultReadBatch}
	s.rep = &ScanReport{Bus: o.Bus, BusName: o.BusName, Options: o, Identity: identityName(spec)}
	s.progress("physd scan: %s (%s/%s, %s); browsing at most %d levels and %d nodes, within %v; Browse and Read requests only",
		spec.Endpoint, spec.Policy, spec.Mode, s.rep.Identity, o.Depth, o.MaxNodes, o.Timeout)
	if err := s.connect(); err != nil {
		return nil, err
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		defer ccancel()
		_ = s.c.Close(cctx)
	}()
	s.rep.Namespaces = s.c.Namespaces()
	s.operationLimits()
	if err := s.browseAll(); err != nil {
		return nil, err
	}
	s.readVariables()
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil, scanErr("", "interrupted", "the scan was interrupted", "run it again; --root and --depth make a scan of a large server shorter")
	}
	s.rep.Elapsed = time.Since(start)
	return s.rep, nil
}

func (s *scanner) progress(format string, a ...any) {
	if s.o.Progress != nil {
		fmt.Fprintf(s.o.Progress, format+"\n", a...)
	}
}

// normalizeSHA256 writes a fingerprint as fingerprint does: lower-case
// hex without separators.
func normalizeSHA256(s string) string {
	return strings.ToLower(strings.NewReplacer(":", "", " ", "", "-", "").Replace(strings.TrimSpace(s)))
}

func identityName(spec *busSpec) string {
	switch {
	case spec.UserCertFile != "":
		return "user certificate " + spec.UserCertFile
	case spec.Username != "":
		return "user " + spec.Username
	}
	return "anonymous"
}

// reqCtx bounds one request by timeout_ms and by the scan's end.
func (s *scanner) reqCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.ctx, s.spec.Timeout)
}

// timeUp says whether the scan's time (or its caller) is over.
func (s *scanner) timeUp() bool { return s.ctx.Err() != nil }

// connect checks what the server offers before the session, so that each
// way a connect fails is an error that says what to change, then opens the
// session as an opcua bus does (Bus.connect).
func (s *scanner) connect() error {
	spec := s.spec
	if spec.ApplicationURI == "" {
		spec.ApplicationURI = defaultApplicationURI()
	}
	ctx, cancel := context.WithTimeout(s.ctx, spec.ConnectTimeout)
	defer cancel()
	eps, err := opcua.GetEndpoints(ctx, spec.Endpoint, opcua.DialTimeout(spec.ConnectTimeout), opcua.RequestTimeout(spec.Timeout))
	s.rep.Requests++
	if err != nil {
		return scanErr("", "unreachable", fmt.Sprintf("cannot reach %s: %v", spec.Endpoint, oneLine(err.Error())), "check the host and port in the endpoint (OPC UA servers listen on 4840 unless configured otherwise), that the server runs, and that no firewall blocks the port; a server that is slow to answer needs a larger connect_timeout_ms")
	}
	var ep *ua.EndpointDescription
	var offered []string
	for _, e := range eps {
		pm := policyName(e.SecurityPolicyURI) + "/" + modeName(e.SecurityMode)
		if !slices.Contains(offered, pm) {
			offered = append(offered, pm)
		}
		if policyName(e.SecurityPolicyURI) == spec.Policy && modeName(e.SecurityMode) == spec.Mode {
			ep = e
		}
	}
	if ep == nil {
		return scanErr("security_policy", "security_not_offered", fmt.Sprintf("%s offers no endpoint with security_policy %s and security_mode %s; it offers %s", spec.Endpoint, spec.Policy, spec.Mode, strings.Join(offered, ", ")), offerFix(offered))
	}
	if spec.Policy != PolicyNone {
		if err := s.checkCertificate(ep); err != nil {
			return err
		}
	}
	if err := identityOffered(spec, ep, eps); err != nil {
		return err
	}
	if spec.Username != "" {
		if _, err := spec.password(); err != nil {
			return scanErr("password_env", "password_missing", fmt.Sprintf("%s is not set in this shell's environment", spec.PasswordEnv), fmt.Sprintf("set it without leaving the password in the shell's history: read -rs %s && export %s", spec.PasswordEnv, spec.PasswordEnv))
		}
	}
	if spec.Policy != PolicyNone && spec.cert == nil {
		cert, key, err := generateCert(spec.ApplicationURI)
		if err != nil {
			return fmt.Errorf("generating an application certificate: %w", err)
		}
		spec.cert, spec.key = cert, key
		s.progress("physd scan: using a certificate generated for this scan (sha256 %s); the server may have to trust it", fingerprint(cert))
	}
	b := &Bus{spec: spec, log: slog.New(slog.DiscardHandler)}
	c, err := b.connect(ctx)
	s.rep.Requests += 4 // endpoints, channel, session (create, activate) and the namespace table
	if err != nil {
		return s.connectError(err)
	}
	s.c = c
	return nil
}

// identityOffered checks that the endpoint takes the scan's identity;
// when it does not, it says which endpoints do.
func identityOffered(spec *busSpec, ep *ua.EndpointDescription, eps []*ua.EndpointDescription) error {
	want, key := ua.UserTokenTypeAnonymous, "username"
	switch {
	case spec.UserCertFile != "":
		want, key = ua.UserTokenTypeCertificate, "user_certificate"
	case spec.Username != "":
		want = ua.UserTokenTypeUserName
	}
	name := strings.TrimPrefix(want.String(), "UserTokenType")
	takes := func(e *ua.EndpointDescription) (yes bool, kinds []string) {
		for _, t := range e.UserIdentityTokens {
			kinds = append(kinds, strings.TrimPrefix(t.TokenType.String(), "UserTokenType"))
			yes = yes || t.TokenType == want
		}
		return yes, kinds
	}
	ok, kinds := takes(ep)
	if ok {
		return nil
	}
	var where []string
	for _, e := range eps {
		if yes, _ := takes(e); yes {
			pm := "security_policy: " + policyName(e.SecurityPolicyURI) + " with security_mode: " + modeName(e.SecurityMode)
			if !slices.Contains(where, pm) {
				where = append(where, pm)
			}
		}
	}
	msg := fmt.Sprintf("the endpoint %s/%s of %s does not take the %s identity (it takes %s)", spec.Policy, spec.Mode, spec.Endpoint, name, orNone(kinds))
	fix := "scan with an identity it takes: username with password_env, user_certificate with user_private_key, or neither for anonymous"
	if len(where) > 0 {
		fix = "the server takes it on another endpoint: " + strings.Join(where, ", or ") + "; or " + strings.TrimPrefix(fix, "scan ")
	}
	return scanErr(key, "identity_not_offered", msg, fix)
}

func orNone(kinds []string) string {
	if len(kinds) == 0 {
		return "no identity at all"
	}
	return strings.Join(kinds, ", ")
}

// offerFix names the flags of one endpoint the server offers, the most
// secure first.
func offerFix(offered []string) string {
	best := ""
	for _, o := range offered {
		p, m, _ := strings.Cut(o, "/")
		if p == PolicyBasic256Sha256 && (best == "" || m == ModeSignAndEncrypt) {
			best = o
		}
	}
	if best == "" && len(offered) > 0 {
		best = offered[0]
	}
	p, m, _ := strings.Cut(best, "/")
	if !oneOf(p, policies) {
		return "physd speaks security_policy None and Basic256Sha256; the server offers none of them with a mode physd has: enable one on the server"
	}
	return fmt.Sprintf("use what the server offers, e.g. security_policy: %s with security_mode: %s", p, m)
}

// checkCertificate judges the certificate the endpoint presents against
// server_certificate or server_trust; with neither, it stops and shows
// the certificate so the person scanning can compare and pin it.
func (s *scanner) checkCertificate(ep *ua.EndpointDescription) error {
	spec := s.spec
	der := ep.ServerCertificate
	leafDesc := "a certificate physd cannot read"
	sum := ""
	if certs, err := x509.ParseCertificates(der); err == nil && len(certs) > 0 {
		der = certs[0].Raw
		sum = fingerprint(der)
		leafDesc = fmt.Sprintf("sha256 %s, subject %q, valid until %s", sum, certs[0].Subject.String(), certs[0].NotAfter.UTC().Format("2006-01-02"))
	}
	pin := fmt.Sprintf("compare the SHA-256 with the one the server shows for its own certificate (its display or web page, or the file in its PKI own/certs); if they match, pin it: server_sha256: %s (the scan saves the certificate and pins it), or server_certificate: the server's certificate file, or server_trust: [the CA that issued it]", sum)
	if spec.serverCert == nil && spec.trust == nil {
		switch want := normalizeSHA256(s.o.PinSHA256); {
		case want == "":
			return scanErr("server_certificate", "server_certificate_unknown", fmt.Sprintf("%s presents a certificate physd has not been told to trust (%s): refusing to connect", spec.Endpoint, leafDesc), pin)
		case want != sum:
			return scanErr("server_sha256", "server_certificate_mismatch", fmt.Sprintf("%s presents a certificate with another SHA-256 than server_sha256 %s (%s): refusing to connect", spec.Endpoint, want, leafDesc),
				"check that the endpoint is the intended server and that the fingerprint was copied whole; "+pin)
		}
		spec.serverCert = der
		s.rep.ServerCertificate, s.rep.ServerSHA256 = der, sum
		return nil
	}
	if _, err := spec.checkServerCert(ep.ServerCertificate); err != nil {
		field := "server_certificate"
		if spec.trust != nil {
			field = "server_trust"
		}
		return scanErr(field, "server_certificate_untrusted", err.Error(), "check that the endpoint is the intended server; if its certificate was renewed, "+pin)
	}
	s.rep.ServerSHA256 = sum
	return nil
}

// connectError turns a failed session into what to change.
func (s *scanner) connectError(err error) error {
	spec := s.spec
	var ce *certError
	if errors.As(err, &ce) && ce.Code() == "identity_not_offered" {
		return scanErr("username", ce.Code(), ce.Error(), "scan with an identity the server takes: username with password_env, user_certificate with user_private_key, or neither for anonymous")
	}
	var se *statusError
	if errors.As(err, &se) {
		msg := se.Error()
		switch se.status {
		case ua.StatusBadIdentityTokenRejected, ua.StatusBadIdentityTokenInvalid, ua.StatusBadUserAccessDenied:
			fix := "check the user name and the password in password_env " + spec.PasswordEnv
			field := "username"
			if spec.userCert != nil {
				fix, field = "the server must trust user_certificate (add it to its trusted user certificates) and know the user it maps to", "user_certificate"
			} else if spec.Username == "" {
				fix = "the server takes no anonymous session: give username with password_env, or user_certificate with user_private_key"
			}
			return scanErr(field, statusName(se.status), msg, fix)
		case ua.StatusBadCertificateUntrusted, ua.StatusBadSecurityChecksFailed, ua.StatusBadCertificateURIInvalid, ua.StatusBadCertificateInvalid:
			fix := fmt.Sprintf("the server does not trust physd's application certificate (sha256 %s): trust it on the server (most servers keep a refused certificate under their rejected certificates: move it to trusted)", fingerprint(spec.cert))
			if spec.CertFile == "" {
				fix += ", then scan again with certificate and private_key: a certificate generated for a scan is new at each run, and the same files in the skeleton make physd run present the certificate the server trusts"
			} else {
				fix += ", then scan again"
			}
			return scanErr("certificate", statusName(se.status), msg, fix)
		}
		return scanErr("", statusName(se.status), msg, se.Fix())
	}
	return scanErr("", "connect_failed", oneLine(err.Error()), "check the server's log for why it refused the session")
}

// operationLimits reads the server's operation limits (Part 5
// ServerCapabilities.OperationLimits) and the continuation points it keeps
// per session, and sizes the Browse and Read batches by them.
func (s *scanner) operationLimits() {
	limit := func(into *int) func(*ua.DataValue) {
		return func(dv *ua.DataValue) {
			if dv.Status != ua.StatusOK || dv.Value == nil {
				return
			}
			switch v := dv.Value.Value().(type) {
			case uint32:
				*into = int(min(v, 1<<20))
			case uint16:
				*into = int(v)
			}
		}
	}
	ol := &s.rep.OperationLimits
	var ops []readOp
	for _, l := range []struct {
		id   uint32
		into *int
	}{
		{id.Server_ServerCapabilities_OperationLimits_MaxNodesPerBrowse, &ol.MaxNodesPerBrowse},
		{id.Server_ServerCapabilities_OperationLimits_MaxNodesPerRead, &ol.MaxNodesPerRead},
		{id.Server_ServerCapabilities_MaxBrowseContinuationPoints, &ol.MaxBrowseContinuationPoints},
	} {
		ops = append(ops, readOp{rv: &ua.ReadValueID{NodeID: ua.NewNumericNodeID(0, l.id), AttributeID: ua.AttributeIDValue}, apply: limit(l.into)})
	}
	s.readAll(ops) // a server that limits reads to fewer than three is read one by one
	s.maxBrowse, s.maxRead = defaultBrowseBatch, defaultReadBatch
	if n := ol.MaxNodesPerBrowse; n > 0 {
		s.maxBrowse = min(s.maxBrowse, n)
	}
	if n := ol.MaxNodesPerRead; n > 0 {
		s.maxRead = min(s.maxRead, n)
	}
	// A Browse may leave one continuation point per node: a batch larger
	// than the server keeps would be answered BadNoContinuationPoints.
	if n := ol.MaxBrowseContinuationPoints; n > 0 {
		s.maxBrowse = min(s.maxBrowse, n)
	}
}

// The batches when the server publishes no limit: small enough for any
// server's message size with short values, large enough that a scan of
// thousands of nodes takes tens of requests. A batch the server refuses
// is halved (readAll, browse).
const (
	defaultBrowseBatch = 100
	defaultReadBatch   = 500
)
