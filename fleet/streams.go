package fleet

import "github.com/nats-io/nats.go/jetstream"

// The streams of a fleet, as physd creates them when one is missing (the
// gateway's uplink, with one replica, or the fleet endpoint, with its
// configured replicas) and as docs/fleet.md tells an operator to create
// them. Every one allows direct gets: a site reads its cursors by direct
// gets of its own subjects (the subject is in the request's subject,
// where the hub's permissions see it).

// AuditStreamConfig is the audit stream: every record exactly once (a
// duplicate window, atomic batches).
func AuditStreamConfig(name, prefix string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{Name: name, Subjects: StreamSubjects(prefix), Storage: jetstream.FileStorage, Replicas: replicas,
		Duplicates: DefaultDuplicates, AllowDirect: true, AllowAtomicPublish: true,
		Description: "physd: every gateway's audit trail, exactly once"}
}

// HistoryStreamConfig is the history stream: each sealed bucket exactly
// once, in bucket order per series.
func HistoryStreamConfig(name, prefix string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{Name: name, Subjects: HistorySubjects(prefix), Storage: jetstream.FileStorage, Replicas: replicas,
		Duplicates: DefaultDuplicates, AllowDirect: true, AllowAtomicPublish: true,
		Description: "physd: every gateway's sealed history buckets"}
}

// AlarmStreamConfig is the alarm stream: the last state of each device.
func AlarmStreamConfig(name, prefix string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{Name: name, Subjects: AlarmSubjects(prefix), Storage: jetstream.FileStorage, Replicas: replicas,
		MaxMsgsPerSubject: 1, AllowDirect: true, Description: "physd: each gateway's active alarms (the last state)"}
}

// CatalogStreamConfig is the catalog stream: the last catalog of each
// gateway (the fleet endpoint knows every gateway when it restarts).
func CatalogStreamConfig(name, prefix string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{Name: name, Subjects: CatalogSubjects(prefix), Storage: jetstream.FileStorage, Replicas: replicas,
		MaxMsgsPerSubject: 1, AllowDirect: true, Description: "physd: each gateway's last catalog (physd fleet)"}
}
