package history

import (
	"bytes"
	"container/heap"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// convertLayout converts a history.db of the earlier layout (a bbolt
// bucket per capability, named after it and keyed by the bucket start)
// into the timeline, and returns the file opened again; a file without
// such buckets is returned as it is.
//
// The converted file is written beside it (history.db.convert), merged
// from all capabilities in key order, and renamed over it once complete
// and synced: a crash or an error meanwhile leaves the old file as it
// was, to be converted at the next start. Nothing is lost but buckets
// older than MaxAge, which retention would drop at the first flush. A
// fresh file rather than a conversion in place: bbolt never shrinks its
// file, and the old pages (4 KiB per capability touched a minute) would
// keep it at the old layout's size, past the size bound; and written in
// transactions of a bounded number of buckets, memory stays small at
// plant scale.
func convertLayout(db *bolt.DB, path string, cfg Config) (*bolt.DB, error) {
	var old int
	err := db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			if !bytes.Equal(name, timeline) {
				old++
			}
			return nil
		})
	})
	if err == nil && old == 0 {
		return db, nil
	}
	tmp := path + ".convert"
	if err == nil {
		err = writeConverted(db, tmp, cfg)
	}
	if err != nil {
		db.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("history %s: converting to the time-ordered layout: %w (the file is unchanged; fix: free space in the state directory, or move %s away to start the history anew)", path, err, path)
	}
	if err := db.Close(); err != nil {
		return nil, fmt.Errorf("history %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("history %s: converting to the time-ordered layout: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync() // the rename survives a crash
		d.Close()
	}
	return openDB(path, cfg)
}

// convertBatch is how many buckets one transaction of the conversion
// writes: bbolt holds a transaction's pages in memory until it commits.
const convertBatch = 50000

// writeConverted writes every bucket of db younger than MaxAge into the
// timeline of a new file at tmp, in key order, and syncs it.
func writeConverted(db *bolt.DB, tmp string, cfg Config) error {
	if err := os.Remove(tmp); err != nil && !os.IsNotExist(err) {
		return err
	}
	ndb, err := openDB(tmp, cfg)
	if err != nil {
		return err
	}
	defer ndb.Close()
	cutoff := time.Now().Add(-cfg.MaxAge).Unix()
	return db.View(func(tx *bolt.Tx) error {
		var m merge
		err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			src := &source{c: b.Cursor()}
			if !bytes.Equal(name, timeline) { // a capability's own bucket
				src.name = bytes.Clone(name)
			}
			k, v := src.c.First()
			return m.push(src, k, v)
		})
		if err != nil {
			return err
		}
		for m.Len() > 0 {
			if err := ndb.Update(func(ntx *bolt.Tx) error {
				b, err := ntx.CreateBucketIfNotExists(timeline)
				if err != nil {
					return err
				}
				b.FillPercent = 1.0
				var last []byte
				for n := 0; n < convertBatch && m.Len() > 0; {
					src := m[0]
					k, v := src.key, src.val
					if start, _, _ := splitKey(k); start >= cutoff && !bytes.Equal(k, last) {
						if err := b.Put(k, v); err != nil {
							return err
						}
						last = k
						n++
					}
					heap.Pop(&m)
					nk, nv := src.c.Next()
					if err := m.push(src, nk, nv); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				return err
			}
		}
		return ndb.Sync()
	})
}

// source is one bbolt bucket being merged: a capability's own (name
// set; its keys are bucket starts) or a timeline.
type source struct {
	c        *bolt.Cursor
	name     []byte
	key, val []byte // the current bucket, keyed as in the timeline
}

// merge is the sources by their current key, smallest first.
type merge []*source

// push adds src at its bucket (k, v) to the merge; nothing at its end.
func (m *merge) push(src *source, k, v []byte) error {
	if k == nil {
		return nil
	}
	if src.name == nil {
		if _, _, err := splitKey(k); err != nil {
			return err
		}
		src.key = k
	} else {
		if len(k) != startLen {
			return fmt.Errorf("bucket %q: key of %d bytes, want a bucket start of %d", src.name, len(k), startLen)
		}
		src.key = bucketKey(int64(binary.BigEndian.Uint64(k)), string(src.name))
	}
	if len(v) != recordLen {
		return fmt.Errorf("record %x: %d bytes, want %d", src.key, len(v), recordLen)
	}
	src.val = v
	heap.Push(m, src)
	return nil
}

func (m merge) Len() int           { return len(m) }
func (m merge) Less(i, j int) bool { return bytes.Compare(m[i].key, m[j].key) < 0 }
func (m merge) Swap(i, j int)      { m[i], m[j] = m[j], m[i] }
func (m *merge) Push(x any)        { *m = append(*m, x.(*source)) }
func (m *merge) Pop() any {
	old := *m
	x := old[len(old)-1]
	*m = old[:len(old)-1]
	return x
}
