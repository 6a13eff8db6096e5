package daemon

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// TestTransactRollsBack: a failing step undoes itself and the steps
// before it, last first; the steps after it never run.
func TestTransactRollsBack(t *testing.T) {
	var log []string
	step := func(name string, fail bool) reloadStep {
		return reloadStep{name, func(context.Context, *change) (func(), error) {
			log = append(log, name)
			undo := func() { log = append(log, "undo "+name) }
			if fail {
				return undo, errors.New(name + " failed")
			}
			return undo, nil
		}}
	}
	err := transact(context.Background(), []reloadStep{step("a", false), step("b", false), step("c", true), step("d", false)}, &change{})
	if err == nil || err.Error() != "c failed" {
		t.Fatalf("transact: %v, want c's error", err)
	}
	if want := []string{"a", "b", "c", "undo c", "undo b", "undo a"}; !slices.Equal(log, want) {
		t.Errorf("effects %v, want %v", log, want)
	}
	log = nil
	if err := transact(context.Background(), []reloadStep{step("a", false), step("b", false)}, &change{}); err != nil || !slices.Equal(log, []string{"a", "b"}) {
		t.Errorf("a transaction that succeeds: %v, effects %v", err, log)
	}
}
