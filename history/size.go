package history

import (
	"math"
	"time"

	bolt "go.etcd.io/bbolt"
)

// sizer keeps history.db within MaxBytes by measuring the file, not by
// an assumed cost per stored bucket.
//
// bbolt's file is as large as its highest page ever written plus one
// growth step (AllocSize), and never shrinks; a page freed by retention
// is reused by a later write. A flush is copy-on-write: it writes its
// pages before the ones they replace are free. So the file stays within
// the bound when, after every flush, the pages in use (the highest page
// less the free and pending ones, as bbolt reports them) leave room for
// the next flush's pages below the bound. After each flush the sizer
// measures the pages in use per stored bucket and the pages the flush
// wrote; the next flush deletes the oldest buckets until the ones left,
// at the measured cost, leave twice the largest flush free (a reader
// holding the last flush's freed pages a moment longer costs one more).
type sizer struct {
	pageSize  int64
	limit     int64   // pages the file may reach: MaxBytes less one growth step
	perBucket float64 // bytes of pages in use per stored bucket at the last measure; 0: nothing stored
	largest   int64   // pages a flush wrote, the most since Open
}

func newSizer(db *bolt.DB, maxBytes int64) *sizer {
	ps := int64(db.Info().PageSize)
	return &sizer{pageSize: ps, limit: (maxBytes-int64(db.AllocSize))/ps - 1}
}

// measure takes the file's pages in use per stored bucket after a
// commit (no write transaction may run meanwhile) and, with written the
// pages that commit wrote, the largest flush.
func (s *sizer) measure(db *bolt.DB, buckets int64, written int64) {
	var high int64
	_ = db.View(func(tx *bolt.Tx) error { high = tx.Size() / s.pageSize; return nil })
	st := db.Stats()
	inUse := high - int64(st.FreePageN) - int64(st.PendingPageN)
	s.perBucket = 0
	if buckets > 0 {
		s.perBucket = float64(inUse*s.pageSize) / float64(buckets)
	}
	s.largest = max(s.largest, written)
}

// room is the pages a flush writing n buckets needs free: twice the
// larger of the largest flush so far and this one's leaves at the
// measured cost, plus the branch pages above them.
func (s *sizer) room(n int) int64 {
	leaves := int64(math.Ceil(float64(n) * s.perBucket / float64(s.pageSize)))
	return 2 * max(s.largest, leaves+leaves/64+4)
}

// keep is how many stored buckets the file may hold after a flush that
// writes n (all, before anything is measured).
func (s *sizer) keep(n int) int64 {
	if s.perBucket == 0 {
		return math.MaxInt64
	}
	return max(int64(float64((s.limit-s.room(n))*s.pageSize)/s.perBucket), 0)
}

// Retention is what the size bound keeps of the capabilities recorded
// now: how long each keeps at one bucket per Resolution (all of MaxAge
// when the size bound is not the one that binds), and the MaxBytes that
// keeps MaxAge of each. It is measured from the file once the file
// holds a few hundred pages, else taken from bbolt's layout (layoutCost).
func (h *History) Retention() (keeps time.Duration, forMaxAge int64) {
	h.mu.Lock()
	n, names := len(h.caps), 0
	for name := range h.caps {
		names += len(name)
	}
	h.mu.Unlock()
	if n == 0 {
		return h.cfg.MaxAge, 0
	}
	h.flushMu.Lock()
	s := *h.size
	stored := h.stored
	h.flushMu.Unlock()
	perBucket := layoutCost(float64(names)/float64(n), s.pageSize)
	if s.perBucket > 0 && float64(stored)*s.perBucket >= 256*float64(s.pageSize) {
		perBucket = s.perBucket
	}
	s.perBucket = perBucket
	steps := float64(s.keep(2*n)) / float64(n)
	keeps = min(time.Duration(steps)*h.cfg.Resolution, h.cfg.MaxAge)
	need := float64(n) * float64(h.cfg.MaxAge/h.cfg.Resolution) * perBucket
	forMaxAge = int64(need) + (s.room(2*n)+1)*s.pageSize + 1<<20 // one growth step: at most 1 MiB
	return keeps, forMaxAge
}

// layoutCost is what a stored bucket costs in full pages of bbolt's
// layout, for capability names of nameLen bytes: the leaf elements (a
// 16-byte header, the key, the record) that fit in a page after its
// 16-byte header, and the branch elements (a 16-byte header and the key)
// above them.
func layoutCost(nameLen float64, pageSize int64) float64 {
	const header = 16
	key := startLen + nameLen
	perLeaf := math.Floor(float64(pageSize-header) / (header + key + recordLen))
	perBranch := math.Floor(float64(pageSize-header) / (header + key))
	return float64(pageSize) / perLeaf * (1 + 1/perBranch)
}
