// Package mesh joins the physd gateways of one site into a mesh
// (hashicorp/memberlist v0.7.0), so an agent talking to any gateway can use
// the whole site. It is the membership and messaging layer only: the node
// and the MCP server build distributed can_do, routed tools and
// notifications on top of it.
//
// # API
//
//	m, err := mesh.New(cfg, catalog, handler) // create, join seeds (a failed join is retried)
//	m.Request(ctx, node, kind, payload)       // one request/reply, deadline = ctx
//	m.Call(ctx, node, kind, payload, opts)    // acknowledged within RequestTimeout; opts.Commit: two-phase
//	m.Fanout(ctx, nodes, kind, payload)       // concurrent; late answers dropped and counted
//	m.Consult(ctx, nodes, kind, payload, max) // Fanout, at most max in flight; NotConsulted when time runs out
//	m.Quorum(ctx, need)                       // fresh acks, decided DecisionMargin before RequestTimeout (policy.QuorumFunc)
//	m.RequireQuorum(ctx, need)                // *QuorumError "partition_no_quorum: alive 2, required 3"
//	m.Members(), m.Catalogs(), m.Status()     // the membership: states, catalogs, partition_state
//	m.PartitionState(), m.SizeEstimate()
//	m.UpdateCatalog(c), m.OnChange(f)         // re-gossip; membership/catalog change callback
//	m.Leave(timeout); m.Shutdown()
//
// # Identity, transport and security
//
// The memberlist node name is the device id. memberlist refuses a second
// node claiming a known name; the mesh makes this loud (an error log on
// every node that sees it) and a newcomer that finds its own name already
// taken while joining stops: New returns ErrDuplicateNode (or Err reports
// it when found by the reconnect loop).
//
// Everything rides memberlist's own transport — one TCP+UDP port, no
// second listener. With SecretKey set (AES-GCM, 16/24/32 bytes), every
// packet and stream is encrypted and authenticated, and the Label is bound
// into the AES-GCM additional data; memberlist also checks the label on
// every packet and stream. A wrong key fails with "no installed keys could
// decrypt the message", a wrong label with a bare EOF. A non-loopback bind
// without a key is a configuration error. Every key holder is trusted
// (memberlist is not Byzantine-tolerant): a key holder can claim any sender
// name in a request.
//
// # Catalogs
//
// Each node's Catalog (tools, kinds, zones, units, tags, ranges) is hashed
// (sha256 of the canonical JSON). The 512-byte node metadata carries only
// that hash. Full catalogs travel on memberlist's push/pull (LocalState /
// MergeRemoteState, each node sending every catalog it holds whose hash
// matches its owner's gossiped hash) and are fetched with a "catalog"
// request whenever a member's gossiped hash differs from the catalog held.
//
// # Requests
//
// Request and Fanout send a user message with memberlist.SendReliable
// (a TCP stream per message, encrypted like everything else) carrying a
// correlation id, the sender's name and reply address, the request kind,
// the time left before the requester's deadline (the remote handler's ctx
// deadline), flags and the payload (≤ MaxPayload = 256 KiB). The reply
// comes back the same way. Replies arriving after the deadline are dropped
// and counted (Fanout's late counter, and LateDropped). The kinds
// "quorum_ack", "catalog" and "leave" are served by the mesh itself.
//
// Deadlines hold end to end: every send is dialed with its context and
// its connection carries its deadline (dial.go), and until the answer (or
// acknowledgement) arrives a new attempt starts every RetryInterval on a
// fresh connection (a lost SYN would cost TCP 1 s). A retry, and every
// message to a peer that needed one in the last minute, also goes as a UDP
// packet (SendBestEffort) when ≤ 1000 bytes; to such a peer attempts go
// twice as often and large messages on two connections. Overlapping
// attempts are served once; a Call is served once, whatever the attempts. Call asks the owner to acknowledge receipt
// within AckWithin (default RequestTimeout): a silent owner (cut link,
// stopped process) fails with ErrNoAck then. With Commit the owner, after
// acknowledging, waits up to its RequestTimeout (monotonic clock) for the
// requester's go-ahead and serves nothing without it; ErrOutcomeUnknown
// means the go-ahead left and no answer came.
//
// # Member states
//
// memberlist's API exposes only alive-or-suspect (Members) versus dead or
// left (NotifyLeave); its per-node suspect state is internal. The mesh
// therefore reports:
//
//   - alive: listed by memberlist, no unanswered negative evidence;
//   - suspect: listed by memberlist, but this node's last probe of it
//     failed ("Suspect X has failed" in memberlist's log) or its last
//     quorum ack or send failed, after the last positive evidence (probe
//     ack, any message from it, an alive event);
//   - dead: memberlist declared it failed (suspicion timeout) and it has
//     not come back; kept for ReconnectTimeout;
//   - left: it announced a graceful Leave.
//
// # Quorum and partition_state
//
// Quorum(ctx, need) counts this node plus every live member that answers a
// quorum_ack request within RequestTimeout. The membership only
// selects whom to ask; a member counts only if it answers now, so a
// partition or crash is reflected within RequestTimeout, long before
// failure detection marks the member dead. policy.QuorumFunc has the same
// signature. The denominator is never memberlist's member count: a
// capability's quorum_size, or a majority of ExpectedSize (RequireQuorum
// with need ≤ 0).
//
// PartitionState classifies the membership (see its doc): partitioned when fewer
// than a majority of ExpectedSize nodes are alive, suspected_partition when
// a majority is alive but a member is suspect or dead or an expected node
// is missing, healthy otherwise. A change is reported once it has held for
// PartitionHold (3 s), and a failed memberlist probe is re-checked at once
// with a quorum_ack, so a lossy link does not make it flap.
//
// # Partitions and re-merge
//
// memberlist does not re-merge a mesh after a long partition: once both
// sides have declared each other dead and GossipToTheDeadTime has passed,
// nothing contacts the other side again. Every ReconnectInterval the mesh
// therefore joins its seeds (those not alive) and every remembered peer
// that is not alive; one successful push/pull re-merges the sides.
//
// # Tests
//
// Package meshtest provides an in-memory fault-injecting transport
// (partitions, crashes, SIGSTOP-like freezes, packet and SYN loss,
// latency, byte counters) with which whole
// meshes run inside testing/synctest.
package mesh
