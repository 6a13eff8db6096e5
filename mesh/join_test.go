package mesh

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestJoinDiscovered: nodes started without seeds (as with mDNS) form
// one mesh when Join is handed their addresses; Join skips this node's
// own entry (by name or by address) and contacts nobody after Leave.
func TestJoinDiscovered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 3, 7, func(cfg *Config) { cfg.Seeds = nil })
		defer c.close()
		n1, n2, n3 := c.nodes["n1"], c.nodes["n2"], c.nodes["n3"]
		if len(n1.Members()) != 1 {
			t.Fatalf("without seeds n1 knows %d members, want only itself", len(n1.Members()))
		}
		targets := []string{
			"n3/" + n3.SelfAddr(), // itself by name
			"x/" + n3.SelfAddr(),  // itself by address
			"n1/" + n1.SelfAddr(),
			"n2/" + n2.SelfAddr(),
		}
		if got := n3.Join(targets); got != 2 {
			t.Fatalf("Join answered %d, want 2 (n1 and n2; itself skipped)", got)
		}
		all := c.names()
		waitFor(t, 60*time.Second, "converge after Join", func() bool { return c.converged(all) })
		if err := n3.Leave(time.Second); err != nil {
			t.Fatal(err)
		}
		if got := n3.Join([]string{"n1/" + n1.SelfAddr()}); got != 0 {
			t.Errorf("Join after Leave contacted %d nodes, want 0", got)
		}
	})
}
