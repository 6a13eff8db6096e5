// Package history keeps a bounded, downsampled history of every numeric
// capability's observations in its own bbolt file in the state directory.
//
// It consumes the node's observation stream (node.Subscribe): it never
// reads a device, and a read or an actuation never waits for it — the
// stream's publish is non-blocking, and when the history falls behind its
// subscription drops observations and counts them. Observations are
// aggregated in memory into fixed buckets of Resolution (min, max, mean,
// count, share of good quality, last) and written in one transaction every
// FlushEvery, so an SD card sees one small write a minute, not one per
// observation.
//
// The file is ordered by time (layout.go): one bbolt bucket holds every
// stored bucket, keyed by its start and then the capability's name. The
// writer flushes as each minute is sealed, so a flush appends the sealed
// minute of every capability at the end of one tree, once and final, and
// retention deletes from its front. A stored bucket costs about 86 bytes
// on disk (a 52-byte record, its key, bbolt's element header and page
// share), and a flush writes about 100 bytes per capability:
// BenchmarkStoredBytes measured, at 2 000 capabilities, 86 bytes a
// bucket and 201 KiB a flush, where a bbolt bucket per capability (the
// earlier layout, converted at Open) took 397 bytes a bucket and wrote a
// page per capability and more, 25 984 KiB a flush under the size bound.
//
// Retention is by age (MaxAge: older buckets go) and by size (MaxBytes):
// the file never grows past MaxBytes, by measurement (size.go): after
// every flush the pages in use per stored bucket are measured, and the
// next flush deletes the oldest buckets of the site until what is left
// leaves room below the bound for two flushes' new pages. The size bound
// is shared by time, not by count: every capability keeps the same
// newest stretch of time, whatever it records, so a capability recorded
// rarely costs only what it stored, and one stored bucket of any
// capability costs the same. At 1-minute buckets the default 64 MiB keeps
// every capability's last week up to about 73 capabilities; with N more,
// about 740 000/N minutes each: 398 minutes of 2 000 measured, 72 minutes
// of a 10 000-point site, which needs about 1 200 MiB for a day
// (Retention computes it for the capabilities recorded; the daemon warns
// at start when it is less than MaxAge).
//
// A manifest reload (Reload) changes which capabilities are recorded:
// stored buckets are keyed by capability name, so a capability the reload
// keeps or redefines continues its series. A capability the reload removes
// (or makes non-numeric) is no longer recorded nor served — the MCP
// resource checks a caller's view against the manifest in force, which no
// longer knows it — but its stored buckets stay in history.db, count in
// the size bound and are dropped by retention like any other (they age
// out of the site's window); if a later reload declares it again, they
// are served again. Stored buckets of a capability that a restart with
// another manifest left behind are kept and dropped the same way.
//
// A bucket is sealed once no observation can enter it any more: a later
// bucket of its capability has started, or its end lies SealGrace in the
// past at a flush (an observation stamped before a sealed bucket's end
// that arrives late is counted in the capability's next bucket). The
// flush that seals it writes its final version: Sealed hands out the
// buckets on disk that are sealed, the ones the fleet uplink copies to
// the hub, each once. A crash loses what was not flushed: the buckets
// since the last flush, and a bucket begun less than freshBucket before
// it, which that flush left in memory.
package history

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// FileName is the history's file in the state directory.
const FileName = "history.db"

// Config bounds the history. Default holds every default.
type Config struct {
	// Resolution is the width of a stored bucket; a query's step is a
	// multiple of it.
	Resolution time.Duration
	// MaxAge drops buckets older than this.
	MaxAge time.Duration
	// MaxBytes bounds the file, as measured (see the package comment):
	// the oldest buckets of the site are dropped first.
	MaxBytes int64
	// FlushEvery is how often the buckets in memory are written (one
	// transaction): what a crash may lose, and what an SD card is written.
	FlushEvery time.Duration
	// Queue is the subscription's room: observations the history may fall
	// behind by before it drops (and counts) them.
	Queue int
	// MaxPoints bounds one query's answer.
	MaxPoints int
}

// Default is the history's bound, chosen for an SD card: 1-minute buckets
// written once a minute, 7 days, at most 64 MiB on disk: a week of up to
// about 73 capabilities; with more the size bound wins (the package
// comment has the figures).
func Default() Config {
	return Config{Resolution: time.Minute, MaxAge: 7 * 24 * time.Hour, MaxBytes: 64 << 20,
		FlushEvery: time.Minute, Queue: 4096, MaxPoints: 2000}
}

func (c Config) withDefaults() Config {
	d := Default()
	if c.Resolution <= 0 {
		c.Resolution = d.Resolution
	}
	if c.MaxAge <= 0 {
		c.MaxAge = d.MaxAge
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = d.MaxBytes
	}
	if c.FlushEvery <= 0 {
		c.FlushEvery = d.FlushEvery
	}
	if c.Queue <= 0 {
		c.Queue = d.Queue
	}
	if c.MaxPoints <= 0 {
		c.MaxPoints = d.MaxPoints
	}
	return c
}

// SealGrace is how long after its end a bucket with no later one is
// sealed: how late an observation may arrive and still be counted in the
// bucket it was taken in.
const SealGrace = 5 * time.Second

// freshBucket: a flush leaves a bucket being filled that began less than
// this long ago in memory (written by the next flush, or by Close): the
// flush that comes as the bucket before it is sealed would otherwise write
// each bucket twice, a few seconds' worth and then final. A crash loses
// those seconds and what came after them until the next flush.
const freshBucket = 2 * SealGrace

// History is the store and its writer.
type History struct {
	cfg     Config
	db      *bolt.DB
	sub     *node.Subscription
	stop    chan struct{}
	done    chan struct{} // run ended
	flushed chan struct{} // flushEvery ended
	close   sync.Once

	mu    sync.Mutex
	caps  map[string]*manifest.Capability // numeric capabilities recorded, by name
	bound int64                           // buckets before this start were sealed at Open
	open  map[string]*agg                 // the bucket being filled, per capability
	dirty map[string]map[int64]*agg       // buckets not yet written
	seen  map[string]bool                 // first bucket since start was seeded from disk
	// spans: where each stored capability's buckets lie (recorded now
	// or not), widened before a write and narrowed after retention.
	spans map[string]span
	// sealed: per capability, the start of the first bucket an
	// observation may still enter (an earlier one is counted there);
	// final: the buckets before it are sealed and written.
	sealed, final map[string]int64
	onFlush       []func()

	flushMu sync.Mutex // one flush at a time; guards stored and size
	stored  int64      // buckets in the file
	size    *sizer
	buckets atomic.Int64 // stored, for Stats
	written atomic.Int64 // bytes the flushes wrote (pages and meta page)

	writeErrs atomic.Uint64
	lastErr   atomic.Pointer[error]
}

// agg is one bucket.
type agg struct {
	start              int64 // unix seconds
	min, max, sum      float64
	count, nvals, good uint32
	last               float64
	lastAt             int64 // unix nanos
}

const recordLen = 8*3 + 4*3 + 8 + 8

func (a *agg) encode() []byte {
	b := make([]byte, recordLen)
	binary.BigEndian.PutUint64(b[0:], math.Float64bits(a.min))
	binary.BigEndian.PutUint64(b[8:], math.Float64bits(a.max))
	binary.BigEndian.PutUint64(b[16:], math.Float64bits(a.sum))
	binary.BigEndian.PutUint32(b[24:], a.count)
	binary.BigEndian.PutUint32(b[28:], a.nvals)
	binary.BigEndian.PutUint32(b[32:], a.good)
	binary.BigEndian.PutUint64(b[36:], math.Float64bits(a.last))
	binary.BigEndian.PutUint64(b[44:], uint64(a.lastAt))
	return b
}

func decode(start int64, b []byte) (*agg, error) {
	if len(b) != recordLen {
		return nil, fmt.Errorf("history record of %d bytes, want %d", len(b), recordLen)
	}
	return &agg{start: start,
		min: math.Float64frombits(binary.BigEndian.Uint64(b[0:])), max: math.Float64frombits(binary.BigEndian.Uint64(b[8:])),
		sum: math.Float64frombits(binary.BigEndian.Uint64(b[16:])), count: binary.BigEndian.Uint32(b[24:]),
		nvals: binary.BigEndian.Uint32(b[28:]), good: binary.BigEndian.Uint32(b[32:]),
		last: math.Float64frombits(binary.BigEndian.Uint64(b[36:])), lastAt: int64(binary.BigEndian.Uint64(b[44:]))}, nil
}

// merge adds b (an earlier part of the same bucket) into a.
func (a *agg) merge(b *agg) {
	if b.nvals > 0 {
		if a.nvals == 0 || b.min < a.min {
			a.min = b.min
		}
		if a.nvals == 0 || b.max > a.max {
			a.max = b.max
		}
	}
	a.sum += b.sum
	a.count += b.count
	a.nvals += b.nvals
	a.good += b.good
	if b.lastAt > a.lastAt {
		a.last, a.lastAt = b.last, b.lastAt
	}
}

// Open opens (or creates) the history file at path for the manifest's
// numeric capabilities (float, int, bool as 0/1). A file of the earlier
// layout (a bbolt bucket per capability) is converted first (convert.go).
func Open(path string, m *manifest.Manifest, cfg Config) (*History, error) {
	cfg = cfg.withDefaults()
	if cfg.Resolution%time.Second != 0 {
		return nil, fmt.Errorf("history resolution %v: use whole seconds", cfg.Resolution)
	}
	db, err := openDB(path, cfg)
	if err != nil {
		return nil, err
	}
	if db, err = convertLayout(db, path, cfg); err != nil {
		return nil, err
	}
	spans, stored, err := readSpans(db)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("history %s: %w", path, err)
	}
	h := &History{cfg: cfg, db: db, caps: numericCaps(m), spans: spans, stored: stored, size: newSizer(db, cfg.MaxBytes),
		open: map[string]*agg{}, dirty: map[string]map[int64]*agg{}, seen: map[string]bool{},
		sealed: map[string]int64{}, final: map[string]int64{},
		stop: make(chan struct{}), done: make(chan struct{}), flushed: make(chan struct{})}
	h.size.measure(db, stored, 0)
	h.buckets.Store(stored)
	// What an earlier run wrote of buckets that ended SealGrace ago is
	// their final version (a crash loses what it had not flushed).
	h.bound = time.Now().Add(-SealGrace).Truncate(cfg.Resolution).Unix()
	return h, nil
}

// openDB opens the bbolt file: its free list is not written (one page
// less per flush; bbolt finds the free pages at Open), and it grows in
// steps of an eighth of the bound, at most 1 MiB.
func openDB(path string, cfg Config) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, fmt.Errorf("history %s: %w", path, err)
	}
	db.AllocSize = int(min(1<<20, cfg.MaxBytes/8))
	return db, nil
}

// sealedFrom is the start of the first bucket of name an observation may
// still enter (h.mu held).
func (h *History) sealedFrom(name string) int64 { return max(h.sealed[name], h.bound) }

// finalFrom is the start of the first bucket of name that is not sealed
// and written (h.mu held).
func (h *History) finalFrom(name string) int64 { return max(h.final[name], h.bound) }

// numericCaps are the capabilities of m the history records: float, int,
// and bool (as 0/1).
func numericCaps(m *manifest.Manifest) map[string]*manifest.Capability {
	caps := map[string]*manifest.Capability{}
	for _, c := range m.Capabilities {
		if numericType(c.DataType) {
			caps[c.Name] = c
		}
	}
	return caps
}

// numericType reports whether the history records a capability of this
// data type.
func numericType(dt string) bool {
	return dt == manifest.TypeFloat || dt == manifest.TypeInt || dt == manifest.TypeBool
}

// Reload records the numeric capabilities of m from now on (after a
// manifest reload; see the package comment for what happens to the
// stored history). It touches no file: a capability the reload adds gets
// its place in history.db at the next flush.
func (h *History) Reload(m *manifest.Manifest) {
	caps := numericCaps(m)
	h.mu.Lock()
	defer h.mu.Unlock()
	for name := range h.caps {
		if caps[name] != nil {
			continue
		}
		// Removed: its bucket being filled is written at the next flush;
		// if it comes back, its first bucket is read from disk again.
		if a := h.open[name]; a != nil {
			h.markDirty(name, a)
			delete(h.open, name)
		}
		delete(h.seen, name)
	}
	h.caps = caps
}

// Config is the history's bound in force.
func (h *History) Config() Config { return h.cfg }

// Follow starts the writer on the node's observation stream; Close stops it.
// It takes the readings of numeric capabilities (the others it does not
// record), with room for Queue of them or one poll round's, the larger.
func (h *History) Follow(n *node.Node) {
	h.sub = n.SubscribeWhere(max(h.cfg.Queue, n.SubscriptionBuffer()), func(o node.Observed) bool {
		return o.Cap != nil && o.Safe == nil && numericType(o.Cap.DataType)
	})
	go h.run()
	go h.flushEvery()
}

// run records the stream until Close. It never waits for the file: a
// flush runs on its own goroutine (flushEvery) and holds the buckets' lock
// only to take them, so a slow disk (a plant's flush writes thousands of
// buckets and syncs) does not leave the stream's room to fill up and drop.
func (h *History) run() {
	defer close(h.done)
	for {
		select {
		case o := <-h.sub.C:
			h.Record(o)
		case <-h.stop:
			h.drainQueue()
			return
		case <-h.sub.Done():
			h.drainQueue()
			<-h.stop
			return
		}
	}
}

// flushEvery writes the buckets every FlushEvery until Close.
//
// The flushes come SealGrace after each multiple of FlushEvery (Unix
// time): with buckets of FlushEvery (the default, a minute), a flush
// comes as the last bucket is sealed, writes it once, final, and leaves
// the one just begun in memory (Flush), so a point costs one write a
// minute, not two.
func (h *History) flushEvery() {
	defer close(h.flushed)
	next := func() time.Duration {
		now := time.Now()
		at := now.Truncate(h.cfg.FlushEvery).Add(SealGrace)
		for !at.After(now) {
			at = at.Add(h.cfg.FlushEvery)
		}
		return at.Sub(now)
	}
	t := time.NewTimer(next())
	defer t.Stop()
	for {
		select {
		case <-t.C:
			h.Flush()
			t.Reset(next())
		case <-h.stop:
			return
		}
	}
}

func (h *History) drainQueue() {
	for {
		select {
		case o := <-h.sub.C:
			h.Record(o)
		default:
			return
		}
	}
}

// Close writes what is in memory and closes the file.
func (h *History) Close() error {
	var err error
	h.close.Do(func() {
		close(h.stop)
		if h.sub != nil {
			<-h.done
			<-h.flushed
			h.sub.Close()
		}
		h.flush(true)
		err = h.db.Close()
	})
	return err
}

// numeric is the value of o as a number, if it has one.
func numeric(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// Record adds one observation (the writer calls it for each observation
// of the stream).
func (h *History) Record(o node.Observed) {
	if o.Cap == nil || o.Safe != nil {
		return
	}
	name := o.Cap.Name
	at := o.At
	if at.IsZero() {
		at = time.Now()
	}
	start := at.Truncate(h.cfg.Resolution).Unix()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.caps[name] == nil {
		return
	}
	a := h.open[name]
	if a != nil && start < a.start {
		start = a.start // published a moment before the last one: same bucket
	}
	if s := h.sealedFrom(name); start < s {
		start = s // its own bucket is sealed (and perhaps copied to the hub): the next one
	}
	if a == nil || a.start != start {
		if a != nil {
			h.markDirty(name, a)
		}
		a = h.bucketFor(name, start)
		h.open[name] = a
	}
	a.count++
	if o.Obs.Quality == promcp.QualityGood {
		a.good++
	}
	// A stale or error observation carries no new value: it counts
	// against the good share but not in min/max/mean.
	if o.Obs.Quality != promcp.QualityGood && o.Obs.Quality != promcp.QualityDegraded {
		return
	}
	v, ok := numeric(o.Obs.Value)
	if !ok {
		return
	}
	if a.nvals == 0 || v < a.min {
		a.min = v
	}
	if a.nvals == 0 || v > a.max {
		a.max = v
	}
	a.nvals++
	a.sum += v
	a.last, a.lastAt = v, at.UnixNano()
}

// bucketFor starts the bucket at start: a bucket still waiting to be
// written, or, for the first bucket since Open, the part a previous run
// wrote (a restart inside a bucket keeps it whole).
func (h *History) bucketFor(name string, start int64) *agg {
	if d := h.dirty[name][start]; d != nil {
		delete(h.dirty[name], start)
		return d
	}
	a := &agg{start: start}
	if !h.seen[name] {
		h.seen[name] = true
		_ = h.db.View(func(tx *bolt.Tx) error {
			if b := tx.Bucket(timeline); b != nil {
				if raw := b.Get(bucketKey(start, name)); raw != nil {
					if old, err := decode(start, raw); err == nil {
						a.merge(old)
					}
				}
			}
			return nil
		})
	}
	return a
}

func (h *History) markDirty(name string, a *agg) {
	if h.dirty[name] == nil {
		h.dirty[name] = map[int64]*agg{}
	}
	h.dirty[name][a.start] = a
}

// Flush writes the buckets in memory and applies retention, in one
// transaction, as the writer does every FlushEvery: a bucket being filled
// that began less than freshBucket ago stays in memory (Close writes it).
func (h *History) Flush() { h.flush(false) }

// flush is Flush; all writes the fresh buckets too.
func (h *History) flush(all bool) {
	h.mu.Lock()
	type rec struct {
		name string
		a    agg
	}
	var recs []rec
	now := time.Now()
	res := int64(h.cfg.Resolution / time.Second)
	// final is, per capability, the start of the first bucket this flush
	// does not seal and write. A bucket waiting in dirty is closed (a
	// later one started, or a reload retired its capability): sealed.
	final := map[string]int64{}
	seal := func(name string, end int64) {
		final[name] = max(final[name], end)
		h.sealed[name] = max(h.sealed[name], end)
	}
	for name, m := range h.dirty {
		for _, a := range m {
			recs = append(recs, rec{name, *a})
			seal(name, a.start+res)
		}
	}
	h.dirty = map[string]map[int64]*agg{}
	for name, a := range h.open {
		final[name] = max(final[name], a.start)
		if !all && now.Before(time.Unix(a.start, 0).Add(freshBucket)) {
			continue // just begun: in memory until the next flush
		}
		recs = append(recs, rec{name, *a})
		if time.Unix(a.start+res, 0).Add(SealGrace).After(now) {
			continue
		}
		// Ended SealGrace ago: sealed, written now for the last time (if
		// the write fails it waits in dirty, like the older ones).
		delete(h.open, name)
		seal(name, a.start+res)
	}
	h.mu.Unlock()
	// In key order: the writes append at the end of the tree.
	sort.Slice(recs, func(i, j int) bool {
		if recs[i].a.start != recs[j].a.start {
			return recs[i].a.start < recs[j].a.start
		}
		return recs[i].name < recs[j].name
	})
	cutoff := time.Now().Add(-h.cfg.MaxAge).Unix()
	h.flushMu.Lock()
	defer h.flushMu.Unlock()
	// Widened before the write (and after the last flush narrowed them):
	// a query or Sealed looks wherever the file may hold buckets.
	h.mu.Lock()
	for _, r := range recs {
		h.widen(r.name, r.a.start)
	}
	h.mu.Unlock()
	stored := h.stored
	var oldest []byte // the oldest key left after retention (nil: none)
	tx, err := h.db.Begin(true)
	if err == nil {
		err = func() error {
			b, err := tx.CreateBucketIfNotExists(timeline)
			if err != nil {
				return err
			}
			b.FillPercent = 1.0 // appends in key order: fill the pages
			for _, r := range recs {
				k := bucketKey(r.a.start, r.name)
				if b.Get(k) == nil {
					stored++
				}
				if err := b.Put(k, r.a.encode()); err != nil {
					return err
				}
			}
			newest := int64(math.MaxInt64) // nothing written: nothing to spare
			if len(recs) > 0 {
				newest = recs[len(recs)-1].a.start
			}
			oldest, stored, err = prune(b, cutoff, newest, stored, h.size.keep(len(recs)))
			return err
		}()
		if err != nil {
			_ = tx.Rollback()
		} else {
			err = tx.Commit()
		}
	}
	if err == nil {
		st := tx.Stats()
		h.written.Add(st.GetPageAlloc() + h.size.pageSize) // the pages and a meta page
		h.size.measure(h.db, stored, st.GetPageCount())
		h.stored = stored
		h.buckets.Store(stored) // for Stats, which must not wait for a flush
		h.mu.Lock()
		h.narrow(oldest)
		for name, f := range final {
			h.final[name] = max(h.final[name], f)
		}
		listeners := h.onFlush
		h.mu.Unlock()
		for _, f := range listeners {
			f()
		}
	}
	if err != nil {
		// Keep the finished buckets for the next flush (the open ones are
		// still in memory).
		h.mu.Lock()
		for _, r := range recs {
			if o := h.open[r.name]; o != nil && o.start == r.a.start {
				continue
			}
			if h.dirty[r.name] == nil || h.dirty[r.name][r.a.start] == nil {
				a := r.a
				h.markDirty(r.name, &a)
			}
		}
		h.mu.Unlock()
		h.writeErrs.Add(1)
		h.lastErr.Store(&err)
		return
	}
	h.lastErr.Store(nil)
}

// prune deletes from the front of the timeline the buckets older than
// cutoff, then the oldest beyond keep, never one that starts at newest
// (the last step this flush wrote: a bound too small for one step of the
// site keeps that step); n is how many the file holds. It returns the
// oldest key left (nil when none) and how many are left.
func prune(b *bolt.Bucket, cutoff, newest, n, keep int64) ([]byte, int64, error) {
	c := b.Cursor()
	k, _ := c.First()
	for ; k != nil; k, _ = c.First() {
		start, _, err := splitKey(k)
		if err != nil {
			return nil, n, err
		}
		if (start >= cutoff && n <= keep) || start >= newest {
			break
		}
		if err := c.Delete(); err != nil {
			return nil, n, err
		}
		n--
	}
	return bytes.Clone(k), n, nil
}

// widen makes name's span include start (h.mu held).
func (h *History) widen(name string, start int64) {
	sp, ok := h.spans[name]
	if !ok {
		h.spans[name] = span{first: start, last: start}
		return
	}
	sp.first, sp.last = min(sp.first, start), max(sp.last, start)
	h.spans[name] = sp
}

// narrow fits the spans to what retention left: nothing before oldest,
// the oldest key left (nil: the file is empty). A capability whose last
// bucket is older has nothing stored any more (h.mu held).
func (h *History) narrow(oldest []byte) {
	if oldest == nil {
		clear(h.spans)
		return
	}
	from, _, _ := splitKey(oldest)
	for name, sp := range h.spans {
		switch {
		case sp.last < from:
			delete(h.spans, name)
		case sp.first < from:
			sp.first = from
			h.spans[name] = sp
		}
	}
}

// Bucket is one step of a query's answer.
type Bucket struct {
	Start     time.Time `json:"start"`
	Min       *float64  `json:"min,omitempty"`
	Max       *float64  `json:"max,omitempty"`
	Mean      *float64  `json:"mean,omitempty"`
	Count     uint32    `json:"count"`
	GoodShare float64   `json:"good_share"`
	Last      *float64  `json:"last,omitempty"`
}

// Series is a query's answer.
type Series struct {
	Capability  string   `json:"capability"`
	Unit        string   `json:"unit,omitempty"`
	Since       string   `json:"since"`
	Until       string   `json:"until"`
	StepS       int64    `json:"step_s"`
	ResolutionS int64    `json:"resolution_s"`
	Buckets     []Bucket `json:"buckets"`
}

// QueryError is a bad query: the message names the parameter and the fix.
type QueryError struct{ Msg string }

func (e *QueryError) Error() string { return e.Msg }

// Query returns the buckets of capability name from since (inclusive) to
// until (exclusive), combined into steps of step (a multiple of the
// resolution; steps aligned to the Unix epoch). Steps without
// observations are left out.
func (h *History) Query(name string, since, until time.Time, step time.Duration) (*Series, error) {
	h.mu.Lock()
	c := h.caps[name]
	h.mu.Unlock()
	if c == nil {
		return nil, &QueryError{fmt.Sprintf("no history of %q: history is kept for the numeric capabilities (float, int, bool) of this node", name)}
	}
	res := h.cfg.Resolution
	step, err := CheckQuery(res, h.cfg.MaxPoints, since, until, step)
	if err != nil {
		return nil, err
	}
	lo, hi := since.Truncate(res).Unix(), until.Unix()
	if until.After(time.Unix(hi, 0)) {
		hi++ // buckets that start before until, the one filling now included
	}
	base := map[int64]*agg{}
	if err := h.scan(name, lo, hi, -1, func(a *agg) { base[a.start] = a }); err != nil {
		return nil, err
	}
	h.mu.Lock()
	overlay := func(a *agg) {
		if a != nil && a.start >= lo && a.start < hi {
			cp := *a
			base[a.start] = &cp // memory holds the whole bucket (seeded from disk)
		}
	}
	for _, a := range h.dirty[name] {
		overlay(a)
	}
	overlay(h.open[name])
	h.mu.Unlock()
	stored := make([]Stored, 0, len(base))
	for _, a := range base {
		stored = append(stored, a.stored())
	}
	return &Series{Capability: c.ToolName(), Unit: c.Unit, Since: since.UTC().Format(time.RFC3339), Until: until.UTC().Format(time.RFC3339),
		StepS: int64(step / time.Second), ResolutionS: int64(res / time.Second), Buckets: Steps(res, step, since, stored)}, nil
}

// CheckQuery checks a query's window and step against a history of
// resolution res answering at most maxPoints steps, and returns the step
// (res when 0). Its errors are *QueryError: they name the parameter and
// the fix.
func CheckQuery(res time.Duration, maxPoints int, since, until time.Time, step time.Duration) (time.Duration, error) {
	if step <= 0 {
		step = res
	}
	if step%res != 0 {
		return 0, &QueryError{fmt.Sprintf("step: %v is not a multiple of the history's resolution %v; fix: use step=%v or a multiple of it", step, res, res)}
	}
	if !until.After(since) {
		return 0, &QueryError{"since: must be before until; fix: e.g. since=1h (one hour ago) and leave until out (now)"}
	}
	if n := until.Sub(since) / step; n > time.Duration(maxPoints) {
		return 0, &QueryError{fmt.Sprintf("step: %v gives %d buckets, more than %d in one answer; fix: use a step of at least %v", step, n, maxPoints, (until.Sub(since)/time.Duration(maxPoints)/res+1)*res)}
	}
	return step, nil
}

// Steps combines stored buckets of resolution res into steps of step
// (aligned to the Unix epoch), leaving out the buckets that start before
// since's bucket; the caller passes only buckets that start before until.
// Steps without observations are left out; the answer is in time order.
func Steps(res, step time.Duration, since time.Time, stored []Stored) []Bucket {
	steps := map[int64]*agg{}
	stepS := int64(step / time.Second)
	from := since.Truncate(res).Unix()
	for _, st := range stored {
		if st.Start < from {
			continue
		}
		k := st.Start - st.Start%stepS
		if steps[k] == nil {
			steps[k] = &agg{start: k}
		}
		a := st.agg()
		steps[k].merge(&a)
	}
	keys := make([]int64, 0, len(steps))
	for k := range steps {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	out := []Bucket{}
	for _, k := range keys {
		a := steps[k]
		b := Bucket{Start: time.Unix(k, 0).UTC(), Count: a.count}
		if a.count > 0 {
			b.GoodShare = float64(a.good) / float64(a.count)
		}
		if a.nvals > 0 {
			mn, mx, mean, last := a.min, a.max, a.sum/float64(a.nvals), a.last
			b.Min, b.Max, b.Mean, b.Last = &mn, &mx, &mean, &last
		}
		out = append(out, b)
	}
	return out
}

// Stored is one stored bucket as history.db holds it: the aggregate, not
// the answer (Steps turns stored buckets into answers). It is what the
// fleet uplink copies to the hub, so a reader there can combine them as
// Query does.
type Stored struct {
	Start  int64   `json:"start"`  // Unix seconds
	Count  uint32  `json:"count"`  // observations
	Good   uint32  `json:"good"`   // of quality good
	Values uint32  `json:"values"` // with a value: Min, Max, Sum and Last are theirs
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Sum    float64 `json:"sum"`
	Last   float64 `json:"last"`
	LastAt int64   `json:"last_at"` // Unix nanoseconds
}

func (a *agg) stored() Stored {
	return Stored{Start: a.start, Count: a.count, Good: a.good, Values: a.nvals, Min: a.min, Max: a.max, Sum: a.sum, Last: a.last, LastAt: a.lastAt}
}

func (s Stored) agg() agg {
	return agg{start: s.Start, count: s.Count, good: s.Good, nvals: s.Values, min: s.Min, max: s.Max, sum: s.Sum, last: s.Last, lastAt: s.LastAt}
}

// Recorded are the capabilities the history records now (the numeric
// ones of the manifest in force), by name.
func (h *History) Recorded() []*manifest.Capability {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*manifest.Capability, 0, len(h.caps))
	for _, c := range h.caps {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Sealed returns up to limit stored buckets of capability name that
// start after `after` (Unix seconds) and are sealed and written (their
// final version), oldest first.
func (h *History) Sealed(name string, after int64, limit int) ([]Stored, error) {
	h.mu.Lock()
	end := h.finalFrom(name)
	h.mu.Unlock()
	var out []Stored
	err := h.scan(name, after+1, end, limit, func(a *agg) { out = append(out, a.stored()) })
	return out, err
}

// scan calls fn with the stored buckets of name that start in [from, to),
// oldest first, at most limit of them (all with a negative limit).
func (h *History) scan(name string, from, to int64, limit int, fn func(*agg)) error {
	h.mu.Lock()
	sp, ok := h.spans[name]
	h.mu.Unlock()
	if !ok {
		return nil
	}
	from, to = max(from, sp.first), min(to, sp.last+1)
	return h.db.View(func(tx *bolt.Tx) error {
		return scanTimeline(tx, name, from, to, int64(h.cfg.Resolution/time.Second), limit, fn)
	})
}

// OnFlush has f called after every flush that wrote (from the flushing
// goroutine: f must not block).
func (h *History) OnFlush(f func()) {
	h.mu.Lock()
	h.onFlush = append(h.onFlush, f)
	h.mu.Unlock()
}

// Stats is the history's state for /metrics.
type Stats struct {
	FileBytes   int64
	Buckets     int    // stored in the file, as of the last flush
	Written     int64  // bytes the flushes since Open wrote to the file (its pages and meta page)
	Dropped     uint64 // observations the history fell behind on
	WriteErrors uint64
	LastError   error
}

// Stats reports the file size, drops and write errors.
func (h *History) Stats() Stats {
	s := Stats{WriteErrors: h.writeErrs.Load()}
	s.Buckets = int(h.buckets.Load())
	s.Written = h.written.Load()
	if fi, err := os.Stat(h.db.Path()); err == nil {
		s.FileBytes = fi.Size()
	}
	if h.sub != nil {
		s.Dropped = h.sub.Dropped()
	}
	if p := h.lastErr.Load(); p != nil {
		s.LastError = *p
	}
	return s
}
