// Package opcua is physd's OPC UA client driver, on gopcua: a bus is one
// server endpoint (security policy and mode, the application certificate,
// the server certificate pinned or checked against a trust list, an
// anonymous, user/password or X.509 user identity) with one session
// shared by every capability bound to it; a binding is a node id (i=, s=,
// g=, b=, with ns=<index> or nsu=<uri>) with its OPC UA type (ua_type)
// and, for an array node, the index of one element.
//
// Reads honour the value's status code: Good is a reading, Uncertain a
// reading served as degraded with the code's name, Bad an error whose code
// is the status name (BadSensorFailure). Writes are refused before they
// are sent when the node publishes an EURange (OPC UA Part 8) the value is
// outside; a Bad write result means the server applied nothing (the node
// answers failed with the status name as code); a write without a reply
// may have been applied (the node reads back and answers partial). The
// node verifies every write by reading the node back.
//
// A service call without a usable reply drops the session; the next read
// or write opens a new one (no sooner than reconnect_backoff_ms after a
// failed attempt, each attempt bounded by connect_timeout_ms), so nothing
// read through a session from before a server restart is served after it.
// An idle session is kept open by a read of the server's state every third
// of the session timeout the server granted.
//
// A capability with poll_ms is a monitored item (drivers.Monitorer;
// monitor.go, subscribe.go, publish.go): sampled every poll_ms, queue
// size 1, its deadband a DataChangeFilter (absolute, or percent of the
// node's EURange), in one subscription per publishing interval on the
// bus's session. Keep-alives come every keepalive_ms; a subscription
// silent past keepalive_ms + a publishing interval + timeout_ms, a failed
// Publish or a lost session tells every item at once and starts over (on
// the same session when it still answers a read, so reads and writes go
// on; else on a new one):
// the previous session's subscriptions are taken over when the server
// did not restart (TransferSubscriptions, initial values sent again),
// else created afresh, so the first value after a loss is one the server
// sent after it. A server that refuses the filter (or has no room) makes
// the node poll the capability, and says so.
//
// Security policies: None, Basic256Sha256, Aes128_Sha256_RsaOaep and
// Aes256_Sha256_RsaPss (each Sign or SignAndEncrypt).
//
// Scan (physd scan opcua) connects as a bus does, browses the address
// space (Browse, BrowseNext, batched Reads; bounded by depth, node count
// and time) and Skeleton writes a manifest from what it found.
//
// Not done: revocation lists for server_trust.
package opcua
