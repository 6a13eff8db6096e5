package node

import (
	"context"
	"fmt"
	"time"

	"github.com/physd/physd/manifest"
)

// busWatchEvery is how often the node looks at its buses' health for the
// bus_restored safe-state event.
const busWatchEvery = 500 * time.Millisecond

// watchBuses drives the outputs whose safe state is on bus_restored to
// safe when their bus answers again after it was down (Health reported an
// error): what the device did meanwhile, and whether it still holds the
// last command, is unknown. It runs until Close.
func (n *Node) watchBuses() {
	defer n.polls.Done()
	t := time.NewTicker(busWatchEvery)
	defer t.Stop()
	down := map[string]time.Time{} // bus name → when it was seen down
	for {
		select {
		case <-n.stopPoll:
			return
		case <-t.C:
		}
		b := n.bound()
		for name, ref := range b.buses {
			err := ref.Health()
			since, wasDown := down[name]
			switch {
			case err != nil && !wasDown:
				down[name] = time.Now()
			case err == nil && wasDown:
				delete(down, name)
				n.busRestored(b, name, since)
			}
		}
	}
}

func (n *Node) busRestored(b *binding, bus string, since time.Time) {
	var tools []string
	for _, cs := range b.caps {
		if cs.cap.Kind == manifest.KindDo && cs.cap.Binding.Bus == bus && cs.cap.Safe.Has(manifest.SafeOnBusRestored) {
			tools = append(tools, cs.tool)
		}
	}
	if len(tools) == 0 {
		return
	}
	reason := fmt.Sprintf("the bus %s answers again after it was down since %s: what its outputs did meanwhile is unknown", bus, since.UTC().Format(time.RFC3339))
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		n.driveSafeTools(ctx, tools, manifest.SafeOnBusRestored, reason)
	}()
}
