package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mesh"
	"github.com/physd/physd/node"
)

// quorumWatchEvery is how often the quorum-loss watcher reads the mesh's
// partition state (a read of the membership, no network round trip).
const quorumWatchEvery = 250 * time.Millisecond

// safeDriveBound bounds how long a watcher waits for the outputs' turns
// and safe drives; a drive not verified by then keeps retrying in the node.
const safeDriveBound = 30 * time.Second

// watchQuorum drives the outputs whose safe state is on quorum_loss to
// safe when this gateway's side of the mesh reports partitioned: fewer
// than a majority of the expected gateways alive, held for the mesh's
// partition hold (the hysteresis that keeps a lossy link from flapping).
// It drives once per partition: an agent that commands the output again
// while partitioned owns that choice (the guard's requires_quorum rules
// still apply). It ends with ctx.
func watchQuorum(ctx context.Context, site *mesh.Mesh, n *node.Node, log *slog.Logger) {
	t := time.NewTicker(quorumWatchEvery)
	defer t.Stop()
	lost := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := site.Status()
		switch {
		case st.PartitionState == mesh.Partitioned && !lost:
			lost = true
			reason := fmt.Sprintf("this gateway is in a minority partition of the mesh (%d of %d gateways alive, a majority is %d, held for %v)",
				st.Alive, st.ExpectedSize, st.Majority, time.Duration(st.PartitionHoldMS)*time.Millisecond)
			log.Warn("quorum lost: driving quorum_loss outputs to safe", "alive", st.Alive, "expected", st.ExpectedSize)
			dctx, cancel := context.WithTimeout(ctx, safeDriveBound)
			n.DriveSafeAll(dctx, manifest.SafeOnQuorumLoss, reason)
			cancel()
		case st.PartitionState != mesh.Partitioned && lost:
			lost = false
			log.Info("quorum regained", "state", st.PartitionState)
		}
	}
}
