package web

import (
	"fmt"
	"testing"
	"time"
)

// TestSignInFailuresCapped: failed sign-ins from more addresses than
// maxFailAddrs keep the table at the cap, the least recently tried
// address evicted first; a record tried again (even refused) is kept; records expire
// after failWindow from the front; and a sign-in's cost does not grow
// with the table (each attempt touches O(1) records).
func TestSignInFailuresCapped(t *testing.T) {
	st := newSessions()
	t0 := time.Unix(1_000_000, 0)
	keep := "192.0.2.1"
	for range freeFailures + 1 {
		if wait, _ := st.attempt(keep, t0); wait != 0 {
			t.Fatalf("the first tries of %s wait %v", keep, wait)
		}
	}
	if st.throttled(keep, t0) == 0 {
		t.Fatalf("%s is not throttled after %d failures", keep, freeFailures+1)
	}
	now := t0
	for i := range 3 * maxFailAddrs {
		now = now.Add(time.Millisecond)
		st.attempt(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), now)
		if i%1000 == 0 {
			// a try of keep, refused while throttled or counted, makes
			// it the most recently tried again
			st.attempt(keep, now)
		}
		if len(st.fails) > maxFailAddrs || st.failOrder.Len() != len(st.fails) {
			t.Fatalf("after %d addresses: %d records, %d in order", i+1, len(st.fails), st.failOrder.Len())
		}
	}
	if len(st.fails) != maxFailAddrs {
		t.Fatalf("%d records, want the cap %d", len(st.fails), maxFailAddrs)
	}
	if _, ok := st.fails["10.0.0.0"]; ok {
		t.Fatal("the least recently tried address was not evicted")
	}
	if f := st.fails[keep]; f == nil || f.n <= freeFailures {
		t.Fatalf("the address tried again lost its count: %+v", f)
	}
	// an undo of a try keeps the table consistent
	_, undo := st.attempt("198.51.100.7", now)
	undo()
	if _, ok := st.fails["198.51.100.7"]; ok || st.failOrder.Len() != len(st.fails) {
		t.Fatalf("an undone only try left a record (%d records, %d in order)", len(st.fails), st.failOrder.Len())
	}
	// everything expires failWindow after its last try
	later := now.Add(failWindow + time.Second)
	st.attempt("203.0.113.9", later)
	if len(st.fails) != 1 || st.failOrder.Len() != 1 {
		t.Fatalf("after the window: %d records, %d in order", len(st.fails), st.failOrder.Len())
	}
}

func BenchmarkSignInAttemptFullTable(b *testing.B) {
	st := newSessions()
	now := time.Unix(1_000_000, 0)
	for i := range maxFailAddrs {
		st.attempt(fmt.Sprintf("10.0.%d.%d", i>>8, i&255), now)
	}
	b.ResetTimer()
	for i := range b.N {
		now = now.Add(time.Microsecond)
		st.attempt(fmt.Sprintf("172.%d.%d.%d", i>>16&255, i>>8&255, i&255), now)
	}
}
