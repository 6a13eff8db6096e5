// Package store is physd's one embedded database (bbolt) in the state
// directory: the idempotency ledger (ledger.go), the rate and cooldown
// history the safety layer commits with it, and the approval nonces. Every
// write that a caller's answer depends on is an fsynced bbolt transaction
// or is made durable elsewhere first (the audit line; see CompleteDeferred).
package store

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

const bucketPrefixKV = "kv_"

// fixStateDir is the remedy for a state directory physd cannot use.
const fixStateDir = "fix: make the directory writable by the user physd runs as, or pass --state DIR with one it can create and write (the ledger and audit trail must survive a reboot)"

// Store wraps the bbolt database.
type Store struct {
	db *bolt.DB

	// deferred holds answers whose durability the caller guaranteed
	// elsewhere (the audit); they reach the database with the next
	// transaction (see CompleteDeferred).
	mu       sync.Mutex
	deferred map[string]*LedgerEntry

	unclean *RunRecord // the previous run's marker when it did not stop cleanly (run.go)
}

// Open opens (creating) dir/physd.db, migrates a ledger written by an
// earlier physd, and compacts the file when most of it is free space (a
// pruned burst). A second daemon on the same state directory fails fast
// instead of waiting on the file lock.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("state directory %s: %w; %s", dir, err, fixStateDir)
	}
	path := filepath.Join(dir, "physd.db")
	db, err := openDB(path)
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, lockedError(dir, path)
	}
	if err != nil {
		return nil, err
	}
	writeOwner(dir)
	if db, err = compactIfSparse(db); err != nil {
		return nil, err
	}
	s := &Store{db: db, deferred: map[string]*LedgerEntry{}}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		if err := s.initBuckets(tx); err != nil {
			return err
		}
		return s.markRun(tx)
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("state database %s: %w", path, err)
	}
	return s, nil
}

func openDB(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 500 * time.Millisecond, NoFreelistSync: true})
	if errors.Is(err, os.ErrPermission) {
		return nil, fmt.Errorf("state database %s: %w; %s", path, err, fixStateDir)
	}
	if err != nil {
		return nil, fmt.Errorf("state database %s: %w", path, err)
	}
	return db, nil
}

// Close writes deferred answers and closes the database.
func (s *Store) Close() error {
	ferr := s.Flush()
	if ferr == nil {
		// Only a stop that kept everything it acknowledged is clean.
		ferr = s.clearRun()
	}
	removeOwner(filepath.Dir(s.db.Path()))
	return errors.Join(ferr, s.db.Close())
}

// Path is the database file.
func (s *Store) Path() string { return s.db.Path() }

// KV is one write to a named bucket that rides along with another commit.
// A nil Value deletes the key.
type KV struct {
	Bucket, Key string
	Value       []byte
}

func putKV(tx *bolt.Tx, kvs []KV) error {
	for _, kv := range kvs {
		b, err := tx.CreateBucketIfNotExists([]byte(bucketPrefixKV + kv.Bucket))
		if err != nil {
			return err
		}
		if kv.Value == nil {
			err = b.Delete([]byte(kv.Key))
		} else {
			err = b.Put([]byte(kv.Key), kv.Value)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Put stores value under key in a named bucket (created on demand).
func (s *Store) Put(bucket, key string, value []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error { return putKV(tx, []KV{{bucket, key, value}}) })
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

// InstallationID is this state directory's random identity, created on
// first use and kept: two gateways never share it, not even with the same
// manifest and keys, and a wiped state directory gets a new one. Approvals
// are bound to it (their nonces live here).
func (s *Store) InstallationID() (string, error) {
	var id string
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte(bucketPrefixKV + "installation"))
		if err != nil {
			return err
		}
		if v := b.Get([]byte("id")); len(v) > 0 {
			id = string(v)
			return nil
		}
		var r [16]byte
		if _, err := rand.Read(r[:]); err != nil {
			return err
		}
		id = hex.EncodeToString(r[:])
		return b.Put([]byte("id"), []byte(id))
	})
	return id, err
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

// All reads every key of a named bucket (empty when it does not exist).
func (s *Store) All(bucket string) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucketPrefixKV + bucket))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			out[string(k)] = append([]byte(nil), v...)
			return nil
		})
	})
	return out, err
}
