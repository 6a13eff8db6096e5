package history

import (
	"bytes"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// history.db's layout: one bbolt bucket, timeline, holds every stored
// bucket of every capability, keyed by the bucket's start (8 bytes,
// big-endian Unix seconds, so keys sort by time) followed by the
// capability's name. A flush writes the last minute and the current one
// of every capability: keys at the end of the tree, appended in order,
// so it rewrites only the few pages at the end (and their branch path)
// where a bbolt bucket per capability rewrote one page per capability.
// Retention deletes from the front. The name is in every key rather
// than a small id from a name table: at the scale site's 8-byte names an
// element is 84 bytes (16 of bbolt's header, 16 of key, 52 of record)
// and a 4-byte id would save 4 of them (5 %), for a table kept in step
// with reloads, restarts with another manifest and retention.
var timeline = []byte("Buckets by time") // no capability is named so (a-z, 0-9, _)

const startLen = 8

// bucketKey is the key of the stored bucket of capability name that
// starts at start.
func bucketKey(start int64, name string) []byte {
	k := make([]byte, startLen+len(name))
	binary.BigEndian.PutUint64(k, uint64(start))
	copy(k[startLen:], name)
	return k
}

// splitKey is a key's bucket start and capability name.
func splitKey(k []byte) (int64, []byte, error) {
	if len(k) <= startLen {
		return 0, nil, fmt.Errorf("history key of %d bytes: want a start and a capability name", len(k))
	}
	return int64(binary.BigEndian.Uint64(k)), k[startLen:], nil
}

// span is where a capability's stored buckets lie: none starts before
// first or after last. It may be wider than what is stored (retention
// raises first to the oldest key left, not to the capability's own), so
// a scan only needs to look inside it; a capability without one has
// nothing stored.
type span struct{ first, last int64 }

// readSpans walks the file once (at Open): the span of every stored
// capability and how many buckets are stored.
func readSpans(db *bolt.DB) (map[string]span, int64, error) {
	spans := map[string]span{}
	var n int64
	err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(timeline)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error {
			start, name, err := splitKey(k)
			if err != nil {
				return err
			}
			n++
			if sp, ok := spans[string(name)]; ok {
				sp.last = start // keys come in time order
				spans[string(name)] = sp
			} else {
				spans[string(name)] = span{first: start, last: start}
			}
			return nil
		})
	})
	return spans, n, err
}

// scanTimeline calls fn with the stored buckets of name that start in
// [from, to), oldest first, at most limit of them (all with a negative
// limit). It seeks each bucket start in turn (one seek per Resolution
// step, a jump over the starts where nothing of the site is stored), so
// a series costs its own steps, not the site's other capabilities.
func scanTimeline(tx *bolt.Tx, name string, from, to, res int64, limit int, fn func(*agg)) error {
	b := tx.Bucket(timeline)
	if b == nil {
		return nil
	}
	c := b.Cursor()
	want := []byte(name)
	for start := from; start < to && limit != 0; {
		k, v := c.Seek(bucketKey(start, name))
		if k == nil {
			return nil
		}
		s, got, err := splitKey(k)
		if err != nil {
			return err
		}
		if s > start {
			start = s // nothing of name at start: on to the next start stored
			continue
		}
		if bytes.Equal(got, want) {
			a, err := decode(s, v)
			if err != nil {
				return err
			}
			fn(a)
			limit--
		}
		start += res
	}
	return nil
}
