package store

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// MinKeep is how long a completed key is always remembered (proMCP §9.2
// asks for a dedup window of at least 24 h): no bound evicts a younger one.
const MinKeep = 24 * time.Hour

// PruneOptions bound the ledger. Keys older than Window go; keys older
// than MinKeep also go, oldest first, while the ledger holds more than
// MaxKeys keys or MaxBytes bytes. Pending entries are never pruned.
type PruneOptions struct {
	Now      time.Time
	Window   time.Duration // default and minimum MinKeep
	MaxKeys  int64         // 0: no count bound
	MaxBytes int64         // 0: no size bound
	Batch    int           // deletions per transaction; default 500
}

// LedgerStats describes the ledger's size.
type LedgerStats struct {
	Keys      int64 `json:"keys"`       // completed keys held
	Bytes     int64 `json:"bytes"`      // their records and index entries, with bbolt's element headers
	Pending   int   `json:"pending"`    // actuations without a recorded outcome
	FileBytes int64 `json:"file_bytes"` // physd.db on disk
	FreeBytes int64 `json:"free_bytes"` // of which free pages (reused before the file grows)
}

// Prune deletes what the options say in short transactions (a few hundred
// keys each), so a large prune never holds the writer for long. It returns
// how many keys it removed.
func (s *Store) Prune(o PruneOptions) (int, error) {
	if o.Window < MinKeep {
		o.Window = MinKeep
	}
	if o.Batch <= 0 {
		o.Batch = 500
	}
	ageCut := o.Now.Add(-o.Window).UnixNano()
	capCut := o.Now.Add(-MinKeep).UnixNano()
	removed := 0
	var keys, size int64 // counted once; new keys between batches only make the bound a little late
	if o.MaxKeys > 0 || o.MaxBytes > 0 {
		_ = s.db.View(func(tx *bolt.Tx) error { keys, size = doneSize(tx); return nil })
	}
	for {
		n := 0
		err := s.update(func(tx *bolt.Tx) error {
			c := tx.Bucket(bucketDone).Cursor()
			for k, v := c.First(); k != nil && n < o.Batch; k, v = c.Next() {
				ts := int64(binary.BigEndian.Uint64(k[:8]))
				over := (o.MaxKeys > 0 && keys > o.MaxKeys) || (o.MaxBytes > 0 && size > o.MaxBytes)
				if ts >= ageCut && !(over && ts < capCut) {
					break
				}
				if err := tx.Bucket(bucketKeys).Delete(k[8:]); err != nil {
					return err
				}
				keys, size = keys-1, size-recordBytes(k, v)
				if err := c.Delete(); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		removed += n
		if err != nil || n < o.Batch {
			return removed, err
		}
	}
}

// recordBytes is what one completed key costs: its record and its index
// entry, each with bbolt's 16-byte leaf element header.
func recordBytes(k, v []byte) int64 { return int64(len(k)+len(v)+16) + int64(len(k)-8+8+16) }

// doneSize counts the completed keys and their bytes (recordBytes). It
// walks the ledger: the pruner does it once a minute, and the database's
// pages are in the page cache anyway.
func doneSize(tx *bolt.Tx) (keys, size int64) {
	_ = tx.Bucket(bucketDone).ForEach(func(k, v []byte) error {
		keys++
		size += recordBytes(k, v)
		return nil
	})
	return keys, size
}

// LedgerStats reports the ledger's size.
func (s *Store) LedgerStats() LedgerStats {
	var st LedgerStats
	_ = s.db.View(func(tx *bolt.Tx) error {
		st.Keys, st.Bytes = doneSize(tx)
		st.Pending = tx.Bucket(bucketPending).Stats().KeyN
		st.FileBytes = tx.Size()
		return nil
	})
	st.Keys += int64(s.deferredCount())
	ds := s.db.Stats()
	st.FreeBytes = int64(ds.FreePageN+ds.PendingPageN) * int64(s.db.Info().PageSize)
	return st
}

func (s *Store) deferredCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.deferred)
}

// Compaction thresholds: a file this large whose free share is above half
// is rewritten at start (bbolt reuses free pages but never shrinks a file,
// so a pruned burst would otherwise keep its disk and page cache forever).
const (
	compactMinFile   = 8 << 20
	compactFreeShare = 0.5
)

// compactIfSparse rewrites the database into a fresh file when most of it
// is free pages, and returns the reopened database.
func compactIfSparse(db *bolt.DB) (*bolt.DB, error) {
	st := db.Stats()
	path := db.Path()
	fi, err := os.Stat(path)
	if err != nil {
		db.Close()
		return nil, err
	}
	free := int64(st.FreePageN+st.PendingPageN) * int64(db.Info().PageSize)
	if fi.Size() < compactMinFile || float64(free) < compactFreeShare*float64(fi.Size()) {
		return db, nil
	}
	tmp := path + ".compact"
	_ = os.Remove(tmp)
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		return db, nil // compaction is an optimisation: keep the file as it is
	}
	if err := bolt.Compact(dst, db, 32<<20); err != nil {
		dst.Close()
		_ = os.Remove(tmp)
		return db, nil
	}
	if err := dst.Sync(); err != nil {
		dst.Close()
		_ = os.Remove(tmp)
		return db, nil
	}
	dst.Close()
	if err := db.Close(); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("state database %s: compaction: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil { // make the rename durable
		_ = d.Sync()
		d.Close()
	}
	return openDB(path)
}
