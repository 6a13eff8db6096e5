// Package store is physd's one embedded database (bbolt) in the state
// directory: the idempotency ledger today, and the rate, cooldown and
// approval state the safety layer keeps. Every write is an fsynced bbolt
// transaction, so what a caller was told survives a crash.
package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucketLedger   = []byte("ledger")    // idempotency key -> LedgerEntry JSON
	bucketByTime   = []byte("ledger_ts") // created(8 bytes BE) + key -> nil, for pruning
	bucketPrefixKV = "kv_"
)

// Ledger entry states.
const (
	StatePending = "pending" // actuation may have started; outcome not recorded
	StateDone    = "done"    // Response is the final answer for this key
)

// LedgerEntry is one idempotency key's record.
type LedgerEntry struct {
	Key      string          `json:"key"`
	Tool     string          `json:"tool"`
	ArgsHash string          `json:"args_hash"`
	State    string          `json:"state"`
	Created  time.Time       `json:"created"`
	Pending  json.RawMessage `json:"pending,omitempty"`  // what was about to happen
	Response json.RawMessage `json:"response,omitempty"` // the exact bytes returned
}

// Store wraps the bbolt database.
type Store struct {
	db *bolt.DB
}

// Open opens (creating) dir/physd.db. A second daemon on the same state
// directory fails fast instead of waiting on the file lock.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, "physd.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 500 * time.Millisecond, NoFreelistSync: true})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("state database %s is locked by another physd process (use a different --state directory)", path)
		}
		return nil, fmt.Errorf("state database %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketLedger, bucketByTime} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Path is the database file.
func (s *Store) Path() string { return s.db.Path() }

// KV is one write to a named bucket that rides along with another commit.
type KV struct {
	Bucket, Key string
	Value       []byte
}

// Begin looks up key. If it is already known, the existing entry is returned
// and nothing is written. Otherwise a pending entry is written durably and
// (nil, nil) is returned: the caller now owns the key and must Complete it.
// extra writes (the safety layer's rate and cooldown history) commit in the
// same transaction, so an actuation costs one fsync here, not two.
func (s *Store) Begin(e LedgerEntry, extra ...KV) (*LedgerEntry, error) {
	var existing *LedgerEntry
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLedger)
		if v := b.Get([]byte(e.Key)); v != nil {
			existing = new(LedgerEntry)
			return json.Unmarshal(v, existing)
		}
		e.State = StatePending
		buf, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if err := b.Put([]byte(e.Key), buf); err != nil {
			return err
		}
		for _, kv := range extra {
			kb, err := tx.CreateBucketIfNotExists([]byte(bucketPrefixKV + kv.Bucket))
			if err != nil {
				return err
			}
			if err := kb.Put([]byte(kv.Key), kv.Value); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketByTime).Put(timeKey(e.Created, e.Key), nil)
	})
	return existing, err
}

// Lookup returns the entry for key, or nil.
func (s *Store) Lookup(key string) (*LedgerEntry, error) {
	var out *LedgerEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketLedger).Get([]byte(key)); v != nil {
			out = new(LedgerEntry)
			return json.Unmarshal(v, out)
		}
		return nil
	})
	return out, err
}

// Complete records the final response for a key begun with Begin.
func (s *Store) Complete(key string, response []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLedger)
		v := b.Get([]byte(key))
		if v == nil {
			return fmt.Errorf("ledger: complete of unknown key %q", key)
		}
		var e LedgerEntry
		if err := json.Unmarshal(v, &e); err != nil {
			return err
		}
		e.State = StateDone
		e.Response = response
		buf, err := json.Marshal(e)
		if err != nil {
			return err
		}
		return b.Put([]byte(key), buf)
	})
}

// Forget removes a key whose actuation provably never started (e.g. the
// device refused before any write), so the caller may retry with it.
func (s *Store) Forget(key string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLedger)
		v := b.Get([]byte(key))
		if v == nil {
			return nil
		}
		var e LedgerEntry
		if err := json.Unmarshal(v, &e); err != nil {
			return err
		}
		if err := tx.Bucket(bucketByTime).Delete(timeKey(e.Created, key)); err != nil {
			return err
		}
		return b.Delete([]byte(key))
	})
}

// PendingEntries lists entries a crash left without an outcome.
func (s *Store) PendingEntries() ([]LedgerEntry, error) {
	var out []LedgerEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLedger).ForEach(func(k, v []byte) error {
			var e LedgerEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			if e.State == StatePending {
				out = append(out, e)
			}
			return nil
		})
	})
	return out, err
}

// Prune drops done entries created before cutoff, and the oldest done
// entries beyond maxEntries, so the ledger stays bounded. Pending entries
// are never pruned. It returns how many were removed.
func (s *Store) Prune(cutoff time.Time, maxEntries int) (int, error) {
	removed := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		led := tx.Bucket(bucketLedger)
		idx := tx.Bucket(bucketByTime)
		excess := led.Stats().KeyN - maxEntries
		c := idx.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			ts := time.Unix(0, int64(binary.BigEndian.Uint64(k[:8])))
			if !ts.Before(cutoff) && excess <= 0 {
				break
			}
			key := k[8:]
			v := led.Get(key)
			if v != nil && bytes.Contains(v, []byte(`"state":"pending"`)) {
				continue
			}
			if err := c.Delete(); err != nil {
				return err
			}
			if err := led.Delete(key); err != nil {
				return err
			}
			removed++
			excess--
		}
		return nil
	})
	return removed, err
}

// LedgerSize is the number of keys held.
func (s *Store) LedgerSize() int {
	n := 0
	_ = s.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketLedger).Stats().KeyN
		return nil
	})
	return n
}

func timeKey(t time.Time, key string) []byte {
	k := make([]byte, 8+len(key))
	binary.BigEndian.PutUint64(k, uint64(t.UnixNano()))
	copy(k[8:], key)
	return k
}

// Put stores value under key in a named bucket (created on demand); for the
// safety layer's counters and nonces.
func (s *Store) Put(bucket, key string, value []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte(bucketPrefixKV + bucket))
		if err != nil {
			return err
		}
		return b.Put([]byte(key), value)
	})
}

// Get reads key from a named bucket; nil when absent.
func (s *Store) Get(bucket, key string) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucketPrefixKV + bucket))
		if b == nil {
			return nil
		}
		if v := b.Get([]byte(key)); v != nil {
			out = append([]byte(nil), v...)
		}
		return nil
	})
	return out, err
}

// ConsumeNonce records a single-use nonce valid until exp; it reports false
// when the nonce was seen before (a replay). Expired nonces are dropped as
// new ones arrive, so the bucket stays small.
func (s *Store) ConsumeNonce(nonce string, exp time.Time) (bool, error) {
	fresh := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte(bucketPrefixKV + "approval_nonces"))
		if err != nil {
			return err
		}
		if b.Get([]byte(nonce)) != nil {
			return nil
		}
		now := time.Now().UnixNano()
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(v) == 8 && int64(binary.BigEndian.Uint64(v)) < now {
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		var ts [8]byte
		binary.BigEndian.PutUint64(ts[:], uint64(exp.UnixNano()))
		fresh = true
		return b.Put([]byte(nonce), ts[:])
	})
	return fresh, err
}
