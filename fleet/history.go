package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
)

// The history's copy at the hub: every sealed bucket of every recorded
// capability (history.Sealed), one message each on
// <prefix>.<site>.<device>.hist.<tool>, Nats-Msg-Id
// <site>/<device>/<tool>/<bucket start>. Like the audit, history.db is the
// source of truth and the stream its copy: each series' cursor is the
// bucket start of the last message the stream holds on its subject, read
// at every sync, and the buckets after it go out through a chain (in
// order, none after a gap), so a cut of hours replays the buckets it
// missed and a stream's series is in bucket order.

// HeaderBucketStart is the bucket start (Unix seconds) of a history
// message.
const HeaderBucketStart = "Physd-Bucket-Start"

// HistoryBucket is one history message: a sealed bucket, as history.db
// holds it (history.Steps combines them into answers).
type HistoryBucket struct {
	Capability  string `json:"capability"` // the tool, read_...
	Unit        string `json:"unit,omitempty"`
	ResolutionS int64  `json:"resolution_s"`
	history.Stored
}

// HistorySubjects are the subjects of a history stream physd creates.
func HistorySubjects(prefix string) []string { return []string{prefix + ".*.*.hist.*"} }

// HistSubject is the subject of one of this gateway's series.
func (u *Uplink) HistSubject(tool string) string { return u.base + ".hist." + tool }

// histCopier copies the history's sealed buckets to the hub.
type histCopier struct {
	u      *Uplink
	h      *history.History
	nudge  chan struct{}
	series map[string]*histSeries // by capability name (the loop's only)
}

type histSeries struct {
	chain
	tool   string
	cursor int64 // the bucket start of the last message the stream holds; valid while synced
	synced bool
	conn   uint64 // the connection it synced on
}

// FollowHistory copies h's sealed buckets to the hub's history stream
// from now on (nothing when network.fleet.history is off), after every
// flush and every Config.Refresh.
func (u *Uplink) FollowHistory(h *history.History) {
	if !u.cfg.History || h == nil {
		return
	}
	c := &histCopier{u: u, h: h, nudge: make(chan struct{}, 1), series: map[string]*histSeries{}}
	h.OnFlush(func() {
		select {
		case c.nudge <- struct{}{}:
		default:
		}
	})
	u.done.Add(1)
	go func() {
		defer u.done.Done()
		c.loop()
	}()
}

func (c *histCopier) loop() {
	tick := time.NewTicker(c.u.cfg.Refresh)
	defer tick.Stop()
	u := c.u
	for {
		select {
		case <-u.stop:
			return
		case <-c.nudge:
		case <-tick.C:
		}
		nc := u.nc.Load()
		if nc == nil || !nc.IsConnected() {
			continue
		}
		u.note(&u.histErr, "history", "fleet: history buckets not copied yet; retrying", c.copy(nc))
	}
}

// copy sends every recorded capability's sealed buckets the stream does
// not hold yet.
func (c *histCopier) copy(nc *nats.Conn) error {
	u := c.u
	var stuck resyncs
	for _, capab := range c.h.Recorded() {
		s := c.series[capab.Name]
		if s == nil {
			tool := capab.ToolName()
			s = &histSeries{tool: tool, chain: chain{life: u.life, js: u.js, nc: nc, subject: u.HistSubject(tool), timeout: u.cfg.PublishTimeout, window: u.cfg.Window}}
			c.series[capab.Name] = s
		}
		for {
			select {
			case <-u.stop:
				return nil
			default:
			}
			if conn := u.conns.Load(); !s.synced || s.conn != conn {
				s.conn = conn
				if err := c.sync(s); err != nil {
					return err
				}
				if err := stuck.check(s.cursor, s.subject, u.msgID(s.tool+"/<start>")); err != nil {
					return err
				}
			}
			recs, err := c.h.Sealed(capab.Name, s.cursor, s.limit())
			if err != nil {
				return fmt.Errorf("history.db: %w", err)
			}
			if len(recs) == 0 {
				break
			}
			msgs := make([]*nats.Msg, len(recs))
			for i, r := range recs {
				if msgs[i], err = c.msg(s, capab.Unit, r); err != nil {
					return err
				}
			}
			n, err := s.send(msgs)
			if n > 0 {
				s.cursor = recs[n-1].Start
				u.histPublished.Add(uint64(n))
			}
			if errors.Is(err, errResync) {
				s.synced = false
				stuck.failed(s.cursor)
				continue
			}
			if err != nil {
				s.synced = false
				return fmt.Errorf("%s: %w", s.subject, err)
			}
		}
	}
	return nil
}

func (c *histCopier) sync(s *histSeries) error {
	u := c.u
	create := HistoryStreamConfig(u.cfg.HistoryStream, u.cfg.Prefix, 1)
	msg, err := s.sync(u.cfg.HistoryStream, &create)
	if err != nil {
		return err
	}
	s.cursor = 0
	if msg != nil {
		if s.cursor, err = strconv.ParseInt(msg.Header.Get(HeaderBucketStart), 10, 64); err != nil {
			return fmt.Errorf("the last message of %s has no %s header", s.subject, HeaderBucketStart)
		}
	}
	s.synced = true
	return nil
}

func (c *histCopier) msg(s *histSeries, unit string, r history.Stored) (*nats.Msg, error) {
	b, err := json.Marshal(HistoryBucket{Capability: s.tool, Unit: unit, ResolutionS: int64(c.h.Config().Resolution / time.Second), Stored: r})
	if err != nil {
		return nil, err
	}
	start := strconv.FormatInt(r.Start, 10)
	m := nats.NewMsg(s.subject)
	m.Data = b
	m.Header.Set(jetstream.MsgIDHeader, c.u.msgID(s.tool+"/"+start))
	m.Header.Set(HeaderBucketStart, start)
	m.Header.Set(HeaderDevice, c.u.cfg.DeviceID)
	return m, nil
}

// SeriesKey names one capability's history at one gateway of one site.
type SeriesKey struct {
	Site   string `json:"site"`
	Device string `json:"device"`
	Tool   string `json:"tool"` // read_...
}

func (k SeriesKey) subject(prefix string) (string, error) {
	for _, f := range []struct{ name, v string }{{"site", k.Site}, {"device", k.Device}, {"tool", k.Tool}} {
		if !manifest.IsSubjectToken(f.v) {
			return "", &history.QueryError{Msg: fmt.Sprintf("%s: %q is not a site, device or tool name (letters, digits, _ and -)", f.name, f.v)}
		}
	}
	return prefix + "." + k.Site + "." + k.Device + ".hist." + k.Tool, nil
}

// HistoryReader answers history queries across sites from the hub's
// history stream: what the fleet endpoint serves. Its user needs the
// stream's info, direct gets, and ordered consumers (the JetStream API's
// STREAM.INFO, DIRECT.GET, CONSUMER.CREATE, CONSUMER.MSG.NEXT and
// CONSUMER.DELETE on the stream).
type HistoryReader struct {
	JS     jetstream.JetStream
	Stream string // default manifest.DefaultFleetHistoryStream
	Prefix string // default physd
	// MaxPoints bounds one answer's steps (default history's 2000).
	MaxPoints int
	// MaxScan bounds the messages one query reads (default 50000: a
	// month of 1-minute buckets, plus what a backfill interleaves).
	MaxScan int
	// Skew is how far ahead of the hub a gateway's clock may be (default
	// 1 h): the read starts at the messages the hub stored Skew before
	// since (a bucket is stored after it ends, by the hub's clock).
	Skew time.Duration
}

func (r *HistoryReader) defaults() HistoryReader {
	c := *r
	if c.Stream == "" {
		c.Stream = "PHYSD_HISTORY"
	}
	if c.Prefix == "" {
		c.Prefix = "physd"
	}
	if c.MaxPoints <= 0 {
		c.MaxPoints = history.Default().MaxPoints
	}
	if c.MaxScan <= 0 {
		c.MaxScan = 50000
	}
	if c.Skew <= 0 {
		c.Skew = time.Hour
	}
	return c
}

// List is the series the stream holds: of one site, or of every site
// with site "".
func (r *HistoryReader) List(ctx context.Context, site string) ([]SeriesKey, error) {
	c := r.defaults()
	filter := c.Prefix + ".*.*.hist.*"
	if site != "" {
		if !manifest.IsSubjectToken(site) {
			return nil, &history.QueryError{Msg: fmt.Sprintf("site: %q is not a site name (letters, digits, _ and -)", site)}
		}
		filter = c.Prefix + "." + site + ".*.hist.*"
	}
	st, err := c.JS.Stream(ctx, c.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", c.Stream, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", c.Stream, err)
	}
	out := make([]SeriesKey, 0, len(info.State.Subjects))
	n := len(splitSubject(c.Prefix))
	for subj := range info.State.Subjects {
		t := splitSubject(subj)
		if len(t) == n+4 {
			out = append(out, SeriesKey{Site: t[n], Device: t[n+1], Tool: t[n+3]})
		}
	}
	sortKeys(out)
	return out, nil
}

// Query answers one series' history from since (inclusive) to until
// (exclusive) in steps of step, as history.History.Query does for the
// local one. A series the stream does not hold is a *history.QueryError.
func (r *HistoryReader) Query(ctx context.Context, k SeriesKey, since, until time.Time, step time.Duration) (*history.Series, error) {
	c := r.defaults()
	subj, err := k.subject(c.Prefix)
	if err != nil {
		return nil, err
	}
	st, err := c.JS.Stream(ctx, c.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", c.Stream, err)
	}
	// The series' last bucket: its resolution, and whether the window
	// can hold anything at all.
	lastMsg, err := st.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, &history.QueryError{Msg: fmt.Sprintf("no history of %s at %s/%s in the hub's stream %s", k.Tool, k.Site, k.Device, c.Stream)}
	}
	if err != nil {
		return nil, fmt.Errorf("the last bucket of %s: %w", subj, err)
	}
	var last HistoryBucket
	if err := json.Unmarshal(lastMsg.Data, &last); err != nil || last.ResolutionS <= 0 {
		return nil, fmt.Errorf("the last bucket of %s is not a history bucket: %v", subj, err)
	}
	res := time.Duration(last.ResolutionS) * time.Second
	step, err = history.CheckQuery(res, c.MaxPoints, since, until, step)
	if err != nil {
		return nil, err
	}
	out := &history.Series{Capability: k.Tool, Unit: last.Unit, Since: since.UTC().Format(time.RFC3339), Until: until.UTC().Format(time.RFC3339),
		StepS: int64(step / time.Second), ResolutionS: last.ResolutionS, Buckets: []history.Bucket{}}
	lo, hi := since.Truncate(res).Unix(), until.Unix()
	if last.Start < lo {
		return out, nil
	}
	from := since.Add(-c.Skew)
	var stored []history.Stored
	err = scan(ctx, c.JS, c.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj},
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &from}, c.MaxScan,
		func(m jetstream.Msg) (bool, error) {
			var b HistoryBucket
			if err := json.Unmarshal(m.Data(), &b); err != nil {
				return false, nil // not a bucket: skipped
			}
			if b.Start >= hi {
				return true, nil // a series is in bucket order: the rest is later
			}
			if b.Start >= lo {
				stored = append(stored, b.Stored)
			}
			return b.Start >= last.Start, nil // the last one there was
		})
	if err != nil {
		return nil, err
	}
	out.Buckets = history.Steps(res, step, since, stored)
	return out, nil
}

// scan reads what an ordered consumer with cfg delivers from stream,
// calling fn for each message until fn says stop, the consumer has
// nothing pending, or max messages were read (a *history.QueryError).
func scan(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.OrderedConsumerConfig, max int, fn func(jetstream.Msg) (bool, error)) error {
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("reading %s: %w", stream, err)
	}
	read := 0
	for {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return fmt.Errorf("reading %s: %w", stream, err)
		}
		n := 0
		for msgs := batch.Messages(); ; {
			var m jetstream.Msg
			select {
			case <-ctx.Done(): // the fetch has its own expiry; the caller's deadline is the one that counts
				return ctx.Err()
			case m = <-msgs:
			}
			if m == nil {
				break
			}
			n++
			if read++; read > max {
				return &history.QueryError{Msg: fmt.Sprintf("the answer needs more than %d messages of the stream %s; fix: a shorter window", max, stream)}
			}
			stop, err := fn(m)
			if err != nil || stop {
				return err
			}
			if meta, err := m.Metadata(); err == nil && meta.NumPending == 0 {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return fmt.Errorf("reading %s: %w", stream, err)
		}
		if n == 0 {
			return nil
		}
	}
}

// splitSubject is a subject's tokens.
func splitSubject(s string) []string { return strings.Split(s, ".") }

func sortKeys(ks []SeriesKey) {
	sort.Slice(ks, func(i, j int) bool {
		a, b := ks[i], ks[j]
		if a.Site != b.Site {
			return a.Site < b.Site
		}
		if a.Device != b.Device {
			return a.Device < b.Device
		}
		return a.Tool < b.Tool
	})
}
