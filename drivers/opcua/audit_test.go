package opcua

import (
	"testing"
	"time"
)

// TestAuditTurnCoversEveryItem: with more items than one audit reads, the
// audits take turns: every item is read within ceil(N/budget) audits, and
// an item an audit suspected is read at the next one, whatever its turn.
func TestAuditTurnCoversEveryItem(t *testing.T) {
	const n, budget = 2500, 1000
	items := make([]*item, n)
	for i := range items {
		items[i] = &item{}
	}
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	read := map[*item]int{}
	for audit := range 3 {
		now = now.Add(5 * time.Second)
		turn := auditTurn(append([]*item(nil), items...), budget)
		if len(turn) != budget {
			t.Fatalf("audit %d reads %d items, want %d", audit, len(turn), budget)
		}
		for _, it := range turn {
			read[it]++
			it.audited = now
		}
	}
	if len(read) != n {
		t.Fatalf("%d of %d items read in 3 audits of %d", len(read), n, budget)
	}
	// Suspected at the last audit: read at the next, first of all.
	suspect := items[7]
	suspect.suspect = now
	turn := auditTurn(append([]*item(nil), items...), budget)
	if turn[0] != suspect {
		t.Fatal("the suspected item waits for its turn")
	}
	if small := auditTurn(items[:10], budget); len(small) != 10 {
		t.Fatalf("a set within the budget: %d of 10 read", len(small))
	}
}
