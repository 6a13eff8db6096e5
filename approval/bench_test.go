package approval_test

import (
	"testing"

	"github.com/physd/physd/approval"
)

// BenchmarkDecideAndRedeem is one two-person round in the authority:
// register, approve (sign the grant), redeem (verify, spend the nonce).
func BenchmarkDecideAndRedeem(b *testing.B) {
	a, err := approval.New(approval.Config{Key: testKey, Nonces: approval.NewMemoryNonces(), Installation: "gw-a"})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c := approval.Call{Tool: "do_heat", Value: 30.0, Key: "k" + string(rune('a'+i%26)) + string(rune(i)), Caller: alice, Definition: "def"}
		p, err := a.Register(approval.Ask{Call: c, ApproverRole: "supervisor"})
		if err != nil {
			b.Fatal(err)
		}
		d, err := a.Decide(p.ID, bob, true, "", nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.Redeem(d.Grant, c); err != nil {
			b.Fatal(err)
		}
	}
}
