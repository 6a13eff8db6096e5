package store

import (
	"encoding/json"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// A run marker tells a start whether the previous run stopped cleanly. Open
// writes one (in the same commit as its bucket setup: no sync of its own)
// and Close removes it after the last write; a run that ended any other way
// — SIGKILL, a panic, a power cut, the service manager's watchdog — leaves
// it behind, and the next Open reports it (UncleanStop). The daemon drives
// the outputs whose safe state is on start_after_crash to safe before it
// serves anything.

var (
	bucketRun = []byte("run")
	keyRun    = []byte("running")
)

// RunRecord is what a run's marker says about it.
type RunRecord struct {
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
}

// markRun reads the previous run's marker, if any, into s.unclean, and
// writes this run's.
func (s *Store) markRun(tx *bolt.Tx) error {
	b, err := tx.CreateBucketIfNotExists(bucketRun)
	if err != nil {
		return err
	}
	if v := b.Get(keyRun); v != nil {
		var prev RunRecord
		if json.Unmarshal(v, &prev) != nil {
			prev = RunRecord{} // unreadable: still an unclean stop
		}
		s.unclean = &prev
	}
	cur, _ := json.Marshal(RunRecord{PID: os.Getpid(), Started: time.Now().UTC()})
	return b.Put(keyRun, cur)
}

// clearRun removes this run's marker: the stop was clean.
func (s *Store) clearRun() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketRun); b != nil {
			return b.Delete(keyRun)
		}
		return nil
	})
}

// UncleanStop reports the previous run's marker when that run did not
// stop cleanly (nil after a clean stop, and for a new state directory).
func (s *Store) UncleanStop() *RunRecord { return s.unclean }
