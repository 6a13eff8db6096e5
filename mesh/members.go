package mesh

import (
	"sort"
	"time"
)

// Member states.
const (
	StateAlive   = "alive"
	StateSuspect = "suspect"
	StateDead    = "dead"
	StateLeft    = "left"
)

// Partition states (PhysMCP metadata.partition_state).
const (
	Healthy            = "healthy"
	SuspectedPartition = "suspected_partition"
	Partitioned        = "partitioned"
)

// Member is one node as this node sees it.
type Member struct {
	Name  string `json:"name"`
	Addr  string `json:"addr"`
	State string `json:"state"` // alive | suspect | dead | left
	Self  bool   `json:"self,omitempty"`
	// Catalog is the latest catalog received whose hash matched the one
	// the member gossiped; nil until it arrives.
	Catalog *Catalog `json:"catalog,omitempty"`
	// LastSeen is the last positive evidence of the member (a probe ack,
	// a message, an alive event). Zero for self.
	LastSeen time.Time `json:"last_seen,omitzero"`
	// DownSince is when this node saw it die or leave (zero while live).
	DownSince time.Time `json:"down_since,omitzero"`
}

// Members returns every node this node knows, itself included, sorted by
// name. State combines memberlist's states (alive/suspect vs dead/left) with
// this node's own evidence: a member memberlist still lists is suspect
// when this node's last probe of it or quorum ack to it failed after the
// last positive evidence. Dead members are kept (and retried by the
// reconnect loop) for ReconnectTimeout; "left" means it announced its
// leave.
func (m *Mesh) Members() []Member {
	live := m.liveNames()
	m.mu.Lock()
	self := m.cat.clone()
	out := []Member{{Name: m.cfg.NodeName, Addr: m.selfAddr, State: StateAlive, Self: true, Catalog: &self}}
	for name, p := range m.peers {
		mem := Member{Name: name, Addr: p.addr, LastSeen: p.lastSeen}
		switch {
		case live[name] && p.suspectAt.After(p.lastSeen):
			mem.State = StateSuspect
		case live[name]:
			mem.State = StateAlive
		case p.left:
			mem.State, mem.DownSince = StateLeft, p.downAt
		default:
			mem.State, mem.DownSince = StateDead, p.downAt
		}
		if p.cat != nil {
			c := p.cat.clone()
			mem.Catalog = &c
		}
		out = append(out, mem)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Catalogs returns the catalogs of live members (alive or suspect), this
// node's included, keyed by node name. Members whose catalog has not
// arrived yet are missing.
func (m *Mesh) Catalogs() map[string]Catalog {
	out := map[string]Catalog{}
	for _, mem := range m.Members() {
		if mem.Catalog != nil && (mem.State == StateAlive || mem.State == StateSuspect) {
			out[mem.Name] = *mem.Catalog
		}
	}
	return out
}

// Status summarises the mesh for the mesh status resource and metrics.
type Status struct {
	Node           string `json:"node"`
	Addr           string `json:"addr"`
	Label          string `json:"label"`
	Encrypted      bool   `json:"encrypted"`
	PartitionState string `json:"partition_state"`
	// PartitionStateNow is the state the membership shows this instant, before
	// the PartitionHold hysteresis; PartitionHoldMS is that hold.
	PartitionStateNow string `json:"partition_state_now"`
	PartitionHoldMS   int64  `json:"partition_hold_ms"`
	SizeEstimate      int    `json:"mesh_size_estimate"`
	ExpectedSize      int    `json:"expected_size"`
	Majority          int    `json:"majority"`
	Alive             int    `json:"alive"` // self included
	Suspect           int    `json:"suspect"`
	Dead              int    `json:"dead"`
	Left              int    `json:"left"`
	LateDropped       int64  `json:"responses_dropped_late_total"`
	HealthScore       int    `json:"health_score"` // memberlist's Lifeguard score, 0 = healthy
	LastJoinError     string `json:"last_join_error,omitempty"`
	Error             string `json:"error,omitempty"` // why the mesh stopped (duplicate id)
}

// Status returns the current summary.
func (m *Mesh) Status() Status {
	mems := m.Members()
	s := Status{
		Node: m.cfg.NodeName, Label: m.cfg.Label, Encrypted: len(m.cfg.SecretKey) > 0,
		ExpectedSize: m.cfg.ExpectedSize, Majority: m.Majority(), LateDropped: m.lateTotal.Load(),
	}
	for _, mem := range mems {
		if mem.Self {
			s.Addr = mem.Addr
		}
		switch mem.State {
		case StateAlive:
			s.Alive++
		case StateSuspect:
			s.Suspect++
		case StateDead:
			s.Dead++
		case StateLeft:
			s.Left++
		}
	}
	s.PartitionStateNow = partitionState(s.Alive, s.Suspect, s.Dead, s.Left, s.ExpectedSize)
	s.PartitionState = m.holdPartitionState(s.PartitionStateNow)
	s.PartitionHoldMS = max(m.cfg.PartitionHold, 0).Milliseconds()
	s.SizeEstimate = s.Alive + s.Suspect + s.Dead
	if m.listSet.Load() {
		s.HealthScore = m.list.GetHealthScore()
	}
	m.mu.Lock()
	s.LastJoinError = m.lastJoinError
	if m.refused != nil {
		s.Error = m.refused.Error()
	}
	m.mu.Unlock()
	return s
}

// holdPartitionState applies the hysteresis: raw (the state the membership shows
// now) replaces the reported state only once it has been observed without
// interruption for PartitionHold. Until the mesh has first been healthy
// (while joining), the state is reported as is.
func (m *Mesh) holdPartitionState(raw string) string {
	now := time.Now()
	m.psMu.Lock()
	defer m.psMu.Unlock()
	if !m.psSettled || m.cfg.PartitionHold < 0 {
		// Until the mesh has first been healthy (joining), report as is.
		m.psSettled = raw == Healthy
		m.psReported, m.psRaw, m.psSince = raw, raw, now
		return raw
	}
	if raw != m.psRaw {
		m.psRaw, m.psSince = raw, now
	}
	if raw != m.psReported && now.Sub(m.psSince) >= m.cfg.PartitionHold {
		m.log.Info("mesh: partition_state changed", "from", m.psReported, "to", raw, "held", now.Sub(m.psSince))
		m.psReported = raw
	}
	return m.psReported
}

// PartitionState classifies this node's membership of the mesh:
//
//   - partitioned: fewer than a majority of ExpectedSize nodes (self
//     included) are alive — this side cannot form a quorum;
//   - suspected_partition: a majority is alive, but some member is suspect
//     or dead (not left), or fewer than ExpectedSize − left nodes are alive
//     (an expected peer never joined);
//   - healthy: otherwise.
//
// A change is reported once it has held for PartitionHold (hysteresis), so
// a lossy link that makes a member briefly suspect does not make it flap.
// It reads the membership only (no network round trip); use Quorum
// for a fresh answer before acting.
func (m *Mesh) PartitionState() string { return m.Status().PartitionState }

// SizeEstimate is the number of nodes this node believes make up the mesh:
// itself plus every alive, suspect or dead (not yet forgotten) member;
// members that left are not counted.
func (m *Mesh) SizeEstimate() int { return m.Status().SizeEstimate }

func partitionState(alive, suspect, dead, left, expected int) string {
	majority := expected/2 + 1
	switch {
	case alive < majority:
		return Partitioned
	case suspect > 0 || dead > 0 || alive < expected-left:
		return SuspectedPartition
	default:
		return Healthy
	}
}
