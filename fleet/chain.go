package fleet

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Headers of a JetStream atomic batch (nats-server 2.12 and later;
// ADR-50). nats.go has no constants for them.
const (
	headerBatchID     = "Nats-Batch-Id"
	headerBatchSeq    = "Nats-Batch-Sequence"
	headerBatchCommit = "Nats-Batch-Commit"
)

// JetStream API error codes the chain acts on.
const (
	errCodeBatchTooLarge     = 10199 // atomic publish batch is too large: {size}
	errCodeBatchTooMany      = 10210 // atomic publish too many inflight
	errCodeBatchDisabled     = 10174 // atomic publish is disabled
	errCodeBatchDuplicate    = 10201 // atomic publish batch contains duplicate message id
	errCodeDuplicateInFlight = 10158 // duplicate message id is in process
	errCodeLastSeqInFlight   = 10164 // wrong last sequence (constant): the subject's previous message is not applied yet
)

// DefaultWindow is how many records one atomic batch carries at most
// (nats-server takes 1000 by default, jetstream.max_batch_size).
const DefaultWindow = 256

// maxBatchBytes bounds one batch's payload (the hub stages a batch in
// memory until its commit).
const maxBatchBytes = 1 << 20

// chain appends one subject's messages to a stream in order such that no
// message is ever stored after a gap in the sequence, however the link
// fails: each send is conditional on the subject's last stream sequence
// being the one the chain last saw (Nats-Expected-Last-Subject-Sequence).
//
// The condition can only name a sequence the chain knows, the stream
// sequence of the subject's last message, and that is known only once
// the previous publish is acknowledged (the stream's sequence is shared
// with every other subject's messages, so it cannot be predicted). A
// window of separate publishes can therefore not each carry the
// condition; nats-server even refuses an expected-sequence publish while
// another message on its subject is in flight in a cluster
// (WrongLastSequenceConstant). So the window is one atomic batch: up to
// window messages sent without waiting (Nats-Batch-Id,
// Nats-Batch-Sequence, Nats-Batch-Commit on the last), the first
// carrying the condition; the stream stores all of them, consecutively,
// or none (a missing message, a duplicate Nats-Msg-Id, a failed condition
// abandons the whole batch). One round trip per window, not per message.
// A stream that does not take atomic batches (allow_atomic: false, or a
// server before 2.12) gets one conditional publish per round trip.
type chain struct {
	life    context.Context // the uplink's: ends at Close (nil: never)
	js      jetstream.JetStream
	nc      *nats.Conn
	subject string
	timeout time.Duration
	window  int

	last   uint64    // the stream sequence of the subject's last message, as of the last sync or ack
	atomic bool      // the stream takes atomic batches (its config, read at sync)
	single time.Time // until then one message at a time (the hub had too many batches in flight)
}

// request is the context of one request to the hub: its timeout, and no
// longer than the uplink lives.
func (c *chain) request() (context.Context, context.CancelFunc) {
	life := c.life
	if life == nil {
		life = context.Background()
	}
	return context.WithTimeout(life, c.timeout)
}

// errResync means the stream holds messages the chain did not see
// acknowledged: read the subject's last message again.
var errResync = errors.New("resync")

// resyncs notices a chain that the stream keeps calling duplicate while
// the subject does not hold what it sends: the Nats-Msg-Ids are another
// publisher's (the stream deduplicates across all its subjects), and
// syncing again would only repeat it.
type resyncs struct {
	pending bool
	at      int64 // the cursor when the send was refused
	times   int
}

// failed records a send refused as a duplicate at cursor.
func (r *resyncs) failed(cursor int64) { r.pending, r.at = true, cursor }

// check is called after the sync that followed: an error once the
// cursor has not moved twice in a row.
func (r *resyncs) check(cursor int64, subject, ids string) error {
	if !r.pending {
		return nil
	}
	r.pending = false
	if cursor > r.at {
		r.times = 0
		return nil
	}
	if r.times++; r.times < 2 {
		return nil
	}
	r.times = 0
	return fmt.Errorf("the stream refuses what follows %d on %s as duplicates, but the subject does not hold it: another publisher uses the same Nats-Msg-Ids (%s); fix: give this gateway a device.id of its own in its site", cursor, subject, ids)
}

// sync reads the stream's configuration and the subject's last message
// (nil when it has none). create, if not nil, is the configuration of
// the stream to create when it is missing.
func (c *chain) sync(stream string, create *jetstream.StreamConfig) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := c.request()
	defer cancel()
	st, err := c.js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) && create != nil {
		st, err = c.js.CreateStream(ctx, *create)
		if err != nil {
			return nil, fmt.Errorf("the hub has no stream %s and physd may not create it (%w); fix: create it on the hub with the subjects %v", stream, err, create.Subjects)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	cfg := st.CachedInfo().Config
	if !cfg.AllowDirect {
		// A site's user may read its own subjects' last messages by
		// direct get only (the subject is in the request's subject, where
		// the hub's permissions see it).
		return nil, fmt.Errorf("stream %s does not allow direct gets; fix: allow_direct: true on the hub (nats stream edit %s --allow-direct)", stream, stream)
	}
	c.atomic = cfg.AllowAtomicPublish
	msg, err := st.GetLastMsgForSubject(ctx, c.subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		c.last = 0
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the last message of %s: %w", c.subject, err)
	}
	c.last = msg.Sequence
	return msg, nil
}

// batchable reports whether the next send may be an atomic batch.
func (c *chain) batchable() bool { return c.atomic && c.window > 1 && time.Now().After(c.single) }

// send stores msgs (all on the chain's subject, in order) right after
// the subject's last message, and returns how many it knows are stored:
// with a nil error all of them. On errResync the stream holds messages
// the chain did not see acknowledged (an earlier attempt's); on any other
// error the ones after n are stored or not (a lost acknowledgement): the
// caller syncs before it sends again, and the condition keeps whatever
// it sends then from landing twice or after a gap.
func (c *chain) send(msgs []*nats.Msg) (int, error) {
	if len(msgs) > 1 && c.batchable() {
		if err := retryInFlight(func() error { return c.sendBatch(msgs) }); err != nil {
			return 0, err
		}
		return len(msgs), nil
	}
	for i, m := range msgs {
		if err := retryInFlight(func() error { return c.sendOne(m) }); err != nil {
			return i, err
		}
	}
	return len(msgs), nil
}

// retryInFlight sends again, a moment later, what a clustered stream
// refused because the subject's previous message (acknowledged: it has
// its quorum) is not applied on the leader yet: WrongLastSequenceConstant
// comes before the message is proposed, so nothing of it was stored.
func retryInFlight(send func() error) error {
	var err error
	for attempt := range 5 {
		var api *jetstream.APIError
		if err = send(); !errors.As(err, &api) || api.ErrorCode != errCodeLastSeqInFlight {
			return err
		}
		time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
	}
	return err
}

// sendOne is one conditional publish, acknowledged.
func (c *chain) sendOne(m *nats.Msg) error {
	ctx, cancel := c.request()
	defer cancel()
	ack, err := c.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(c.last), jetstream.WithRetryAttempts(0))
	if err != nil {
		return c.failed(err)
	}
	if ack.Duplicate {
		// Already stored by an attempt whose ack was lost; the sequence
		// the ack names is the original's: resync.
		return errResync
	}
	c.last = ack.Sequence
	return nil
}

// sendBatch is one atomic batch: every message but the last published
// without waiting, the first carrying the condition, the last the commit
// that the stream acknowledges for all.
func (c *chain) sendBatch(msgs []*nats.Msg) error {
	ctx, cancel := c.request()
	defer cancel()
	id := nuid.Next()
	for i, m := range msgs {
		m.Header.Set(headerBatchID, id)
		m.Header.Set(headerBatchSeq, strconv.Itoa(i+1))
		if i == 0 {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(c.last, 10))
		}
		if i < len(msgs)-1 {
			if err := c.nc.PublishMsg(m); err != nil {
				// The hub abandons the incomplete batch (its
				// jetstream batch timeout): nothing of it is stored.
				return fmt.Errorf("batch of %d, message %d: %w", len(msgs), i+1, err)
			}
			continue
		}
		m.Header.Set(headerBatchCommit, "1")
		ack, err := c.js.PublishMsg(ctx, m, jetstream.WithRetryAttempts(0))
		if err != nil {
			return c.failed(err)
		}
		c.last = ack.Sequence // the batch's last message: a batch is stored consecutively
	}
	return nil
}

// limit is how many messages the next send takes.
func (c *chain) limit() int {
	if c.batchable() {
		return c.window
	}
	return 1
}

// failed classifies a refused or unanswered send, and adapts the window
// to a hub that limits batches.
func (c *chain) failed(err error) error {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case errCodeBatchDuplicate, errCodeDuplicateInFlight:
			return errResync
		case errCodeBatchTooLarge:
			// The hub's jetstream.max_batch_size is smaller: use it.
			var size int
			if _, serr := fmt.Sscanf(api.Description, "atomic publish batch is too large: %d", &size); serr == nil && size > 0 && size < c.window {
				c.window = size
			} else {
				c.window = max(c.window/2, 1)
			}
		case errCodeBatchTooMany:
			c.single = time.Now().Add(10 * time.Second)
		case errCodeBatchDisabled:
			c.atomic = false // until the next sync reads the stream's config
		}
	}
	return err
}
