package node

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/physd/physd/interlock"
	"github.com/physd/physd/promcp"
)

// Interlocks whose condition reads another gateway's capability
// (interlocks[].requires/while.source) get that reading over the mesh:
// the node asks the owner every third of the rule's max_age, each request
// bounded by half of it, and judges the rules on every answer. An owner
// that does not answer, or answers an error, leaves the reading unknown:
// the unsafe side, like a local reading that fails.

// RemoteReader is implemented by a Remote that can read another
// gateway's capability (meshnode.Remote).
type RemoteReader interface {
	ReadRemote(ctx context.Context, owner, tool string, maxAge time.Duration) (promcp.Observation, error)
}

// remoteReads caches the mesh readings the rules use, by Condition.Key.
type remoteReads struct {
	mu       sync.Mutex
	last     map[string]remoteReading
	inFlight map[string]bool
}

type remoteReading struct {
	obs promcp.Observation
	at  time.Time // when the answer arrived
	err string
}

// remoteReading is the cached reading of key (source/read_x) as the rules
// see it.
func (n *Node) remoteReading(key string) interlock.Reading {
	n.rr.mu.Lock()
	r, ok := n.rr.last[key]
	n.rr.mu.Unlock()
	if !ok {
		return interlock.Reading{Error: "not read over the mesh yet"}
	}
	if r.err != "" {
		return interlock.Reading{Error: r.err}
	}
	age := time.Duration(r.obs.AgeMS)*time.Millisecond + time.Since(r.at)
	out := interlock.Reading{Known: r.obs.Value != nil, Value: r.obs.Value, Quality: r.obs.Quality, Age: age}
	if r.obs.Reason != "" && r.obs.Quality != promcp.QualityGood {
		out.Error = r.obs.Reason
	}
	return out
}

// fetchRemote asks the owner for one reading and judges the rules that
// read it.
func (n *Node) fetchRemote(ctx context.Context, rd interlock.RemoteReading) {
	rr, ok := n.remote.(RemoteReader)
	key := rd.Key()
	var r remoteReading
	if !ok {
		r = remoteReading{err: "this gateway has no mesh to read " + key + " over", at: time.Now()}
	} else {
		ctx, cancel := context.WithTimeout(ctx, max(rd.MaxAge/2, 100*time.Millisecond))
		o, err := rr.ReadRemote(ctx, rd.Source, rd.Read, rd.MaxAge/3)
		cancel()
		r = remoteReading{obs: o, at: time.Now()}
		if err != nil {
			r.err = "the owner " + rd.Source + " did not answer: " + err.Error()
		}
	}
	n.rr.mu.Lock()
	n.rr.last[key] = r
	n.rr.mu.Unlock()
	if rules := n.interlocks().Reading(key); len(rules) > 0 {
		n.judgePlant(rules)
	}
}

// pollRemoteReadings keeps the rules' mesh readings fresh until Close.
func (n *Node) pollRemoteReadings() {
	defer n.polls.Done()
	t := time.NewTicker(remotePollTick)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-n.stopPoll:
			return
		case <-t.C:
		}
		for _, rd := range n.interlocks().Remote() {
			key := rd.Key()
			n.rr.mu.Lock()
			last, seen := n.rr.last[key]
			due := !seen || time.Since(last.at) >= rd.MaxAge/3
			if !due || n.rr.inFlight[key] {
				n.rr.mu.Unlock()
				continue
			}
			n.rr.inFlight[key] = true
			n.rr.mu.Unlock()
			wg.Go(func() {
				defer func() {
					n.rr.mu.Lock()
					delete(n.rr.inFlight, key)
					n.rr.mu.Unlock()
				}()
				n.fetchRemote(ctx, rd)
			})
		}
	}
}

// remotePollTick is how often the poller looks for readings that are due.
const remotePollTick = 100 * time.Millisecond

// isRemoteKey tells a mesh reading's key (source/read_x) from a local tool.
func isRemoteKey(key string) bool { return strings.Contains(key, "/") }
