package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The idempotency ledger (docs/design.md "The actuation path"). Layout:
//
//	ledger_pending  key -> LedgerEntry JSON            (few: actuations under way)
//	ledger_done     created(8, BE ns) + key -> record  (time order: appends, pruning from the front)
//	ledger_keys     key -> created(8)                  (the index a lookup by key needs)
//
// A done record is compact (codec.go): the answer is deflated against a
// dictionary of do_ answers, so a key costs ≈ 300–600 bytes on disk, and
// the heap holds nothing per key.
var (
	bucketPending = []byte("ledger_pending")
	bucketDone    = []byte("ledger_done")
	bucketKeys    = []byte("ledger_keys")

	// The layout of physd ≤ 0.1: JSON entries by key, and a time index.
	bucketLegacyLedger = []byte("ledger")
	bucketLegacyByTime = []byte("ledger_ts")
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
	ArgsHash string          `json:"args_hash"` // hex sha256 of the arguments
	State    string          `json:"state"`
	Created  time.Time       `json:"created"`
	Pending  json.RawMessage `json:"pending,omitempty"`  // what was about to happen
	Response json.RawMessage `json:"response,omitempty"` // the exact bytes returned
}

func (s *Store) initBuckets(tx *bolt.Tx) error {
	for _, b := range [][]byte{bucketPending, bucketDone, bucketKeys} {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return err
		}
	}
	return migrateLegacy(tx)
}

// Begin looks key up. If it is already known, the existing entry is
// returned and nothing is written. Otherwise a pending entry is written
// durably and (nil, nil) is returned: the caller now owns the key and must
// Complete it (or Forget it if the device was not touched). extra runs
// inside the same transaction and its writes commit with the entry (the
// safety layer's rate and cooldown history), so they cost no sync of their
// own; answers deferred with CompleteDeferred are written by it too.
func (s *Store) Begin(e LedgerEntry, extra func() []KV) (*LedgerEntry, error) {
	if d := s.deferredEntry(e.Key); d != nil {
		return d, nil
	}
	var existing *LedgerEntry
	err := s.update(func(tx *bolt.Tx) error {
		found, err := lookupTx(tx, e.Key)
		if err != nil || found != nil {
			existing = found
			return err
		}
		e.State, e.Response = StatePending, nil
		buf, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if err := tx.Bucket(bucketPending).Put([]byte(e.Key), buf); err != nil {
			return err
		}
		if extra != nil {
			return putKV(tx, extra())
		}
		return nil
	})
	return existing, err
}

// Lookup returns the entry for key, or nil.
func (s *Store) Lookup(key string) (*LedgerEntry, error) {
	if d := s.deferredEntry(key); d != nil {
		return d, nil
	}
	var out *LedgerEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = lookupTx(tx, key)
		return err
	})
	return out, err
}

func (s *Store) deferredEntry(key string) *LedgerEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.deferred[key]; ok {
		e := *r
		return &e
	}
	return nil
}

func lookupTx(tx *bolt.Tx, key string) (*LedgerEntry, error) {
	if v := tx.Bucket(bucketPending).Get([]byte(key)); v != nil {
		e := new(LedgerEntry)
		if err := json.Unmarshal(v, e); err != nil {
			return nil, fmt.Errorf("ledger: pending entry %q: %w", key, err)
		}
		return e, nil
	}
	ts := tx.Bucket(bucketKeys).Get([]byte(key))
	if len(ts) != 8 {
		return nil, nil
	}
	v := tx.Bucket(bucketDone).Get(doneKey(ts, key))
	if v == nil {
		return nil, fmt.Errorf("ledger: index names %q but its record is missing", key)
	}
	return decodeDone(key, ts, v)
}

// Complete records the final answer of a key begun with Begin, durably,
// before it returns. e carries Key, Tool, ArgsHash, Created and Response.
func (s *Store) Complete(e LedgerEntry) error {
	return s.update(func(tx *bolt.Tx) error { return completeTx(tx, &e) })
}

// CompleteDeferred records the final answer of a key whose answer the
// caller has already made durable elsewhere (an fsynced audit line that
// recovery reads back; see node's recovery). The entry is served from
// memory and written with the next transaction (the next Begin, Flush or
// Prune), so a completed actuation costs no ledger sync of its own.
func (s *Store) CompleteDeferred(e LedgerEntry) {
	e.State = StateDone
	s.mu.Lock()
	s.deferred[e.Key] = &e
	s.mu.Unlock()
}

// Flush writes deferred answers.
func (s *Store) Flush() error {
	s.mu.Lock()
	n := len(s.deferred)
	s.mu.Unlock()
	if n == 0 {
		return nil
	}
	return s.update(func(*bolt.Tx) error { return nil })
}

// update runs fn in a write transaction that also writes the deferred
// answers, and forgets those once the transaction committed.
func (s *Store) update(fn func(tx *bolt.Tx) error) error {
	s.mu.Lock()
	batch := make([]*LedgerEntry, 0, len(s.deferred))
	for _, e := range s.deferred {
		batch = append(batch, e)
	}
	s.mu.Unlock()
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, e := range batch {
			if err := completeTx(tx, e); err != nil {
				return err
			}
		}
		return fn(tx)
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	for _, e := range batch {
		if s.deferred[e.Key] == e {
			delete(s.deferred, e.Key)
		}
	}
	s.mu.Unlock()
	return nil
}

func completeTx(tx *bolt.Tx, e *LedgerEntry) error {
	pending := tx.Bucket(bucketPending)
	if pending.Get([]byte(e.Key)) == nil {
		if ts := tx.Bucket(bucketKeys).Get([]byte(e.Key)); ts != nil {
			return nil // already complete (written by an earlier flush)
		}
		return fmt.Errorf("ledger: complete of unknown key %q", e.Key)
	}
	if err := pending.Delete([]byte(e.Key)); err != nil {
		return err
	}
	return putDone(tx, e)
}

// Forget removes a pending key whose actuation provably never touched the
// device, so the caller may retry with it. extra runs inside the same
// transaction (the safety layer gives back the rate slot). A completed key
// is never forgotten.
func (s *Store) Forget(key string, extra func() []KV) error {
	return s.update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketPending).Delete([]byte(key)); err != nil {
			return err
		}
		if extra != nil {
			return putKV(tx, extra())
		}
		return nil
	})
}

// PendingEntries lists entries a crash left without an outcome.
func (s *Store) PendingEntries() ([]LedgerEntry, error) {
	var out []LedgerEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPending).ForEach(func(k, v []byte) error {
			var e LedgerEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("ledger: pending entry %q: %w", k, err)
			}
			out = append(out, e)
			return nil
		})
	})
	return out, err
}

func doneKey(ts []byte, key string) []byte {
	k := make([]byte, 0, 8+len(key))
	return append(append(k, ts...), key...)
}

func putDone(tx *bolt.Tx, e *LedgerEntry) error {
	ts := make([]byte, 8)
	binary.BigEndian.PutUint64(ts, uint64(e.Created.UnixNano()))
	v, err := encodeDone(e)
	if err != nil {
		return err
	}
	done := tx.Bucket(bucketDone)
	done.FillPercent = 1 // keys arrive in time order: fill pages fully
	k := doneKey(ts, e.Key)
	if err := done.Put(k, v); err != nil {
		return err
	}
	return tx.Bucket(bucketKeys).Put([]byte(e.Key), ts)
}

// migrateLegacy moves a ledger written by physd ≤ 0.1 (JSON entries keyed
// by idempotency key) into the current layout, in the open transaction.
func migrateLegacy(tx *bolt.Tx) error {
	old := tx.Bucket(bucketLegacyLedger)
	if old == nil {
		return nil
	}
	err := old.ForEach(func(k, v []byte) error {
		var e LedgerEntry
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("ledger migration: entry %q: %w", k, err)
		}
		if e.State == StatePending {
			return tx.Bucket(bucketPending).Put(k, v)
		}
		return putDone(tx, &e)
	})
	if err != nil {
		return err
	}
	if err := tx.DeleteBucket(bucketLegacyLedger); err != nil {
		return err
	}
	if tx.Bucket(bucketLegacyByTime) != nil {
		return tx.DeleteBucket(bucketLegacyByTime)
	}
	return nil
}
