package mesh

import (
	"encoding/binary"
	"errors"
)

// Wire format of the user messages carried by memberlist's reliable channel
// (SendReliable → the delegate's NotifyMsg). memberlist encrypts the whole
// stream (AES-GCM with the label as additional data) when a key is set.
//
//	byte 0     wireVersion (2; version 1 had no flags)
//	byte 1     msgRequest | msgReply | msgAck | msgCommit
//	uvarint    correlation id (the requester's)
//	string     from: sender node name          (uvarint length + bytes)
//	string     reply address "ip:port" (request) / "" (reply)
//	string     kind (request) / error text (reply; "" = success)
//	uvarint    budget in ms (request: time left before the requester's
//	           deadline) / 0 (others)
//	uvarint    flags (request): flagAck, flagCommit
//	rest       payload
//
// msgAck (owner → requester, "received") and msgCommit (requester → owner,
// "go ahead") carry only the id, the sender and, for msgCommit, the reply
// address.
const (
	wireVersion = 2
	msgRequest  = 1
	msgReply    = 2
	msgAck      = 3
	msgCommit   = 4

	// flagAck asks the owner to acknowledge receipt at once (msgAck).
	flagAck = 1
	// flagCommit asks the owner to acknowledge and then wait for msgCommit
	// before serving the request (implies flagAck).
	flagCommit = 2

	maxWireString = 4096
	// maxMessage is the largest user message accepted off the wire.
	maxMessage = MaxPayload + 4*maxWireString + 64
	// maxErrorText truncates remote error messages.
	maxErrorText = 1024
)

type message struct {
	typ     byte
	id      uint64
	from    string
	addr    string // reply address (requests)
	text    string // kind (requests) or error (replies)
	budget  uint64 // ms (requests)
	flags   uint64 // requests
	payload []byte
}

func (w *message) encode() []byte {
	b := make([]byte, 0, 2+4*binary.MaxVarintLen64+len(w.from)+len(w.addr)+len(w.text)+len(w.payload))
	b = append(b, wireVersion, w.typ)
	b = binary.AppendUvarint(b, w.id)
	for _, s := range []string{w.from, w.addr, w.text} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, w.budget)
	b = binary.AppendUvarint(b, w.flags)
	return append(b, w.payload...)
}

var errBadMessage = errors.New("malformed mesh message")

// decodeMessage parses b; the payload aliases b.
func decodeMessage(b []byte) (message, error) {
	var w message
	if len(b) < 2 || b[0] != wireVersion || b[1] < msgRequest || b[1] > msgCommit || len(b) > maxMessage {
		return w, errBadMessage
	}
	w.typ = b[1]
	b = b[2:]
	id, k := binary.Uvarint(b)
	if k <= 0 {
		return w, errBadMessage
	}
	w.id, b = id, b[k:]
	var strs [3]string
	for i := range strs {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > maxWireString || uint64(len(b)-k) < n {
			return w, errBadMessage
		}
		strs[i] = string(b[k : k+int(n)])
		b = b[k+int(n):]
	}
	w.from, w.addr, w.text = strs[0], strs[1], strs[2]
	budget, k := binary.Uvarint(b)
	if k <= 0 {
		return w, errBadMessage
	}
	w.budget, b = budget, b[k:]
	flags, k := binary.Uvarint(b)
	if k <= 0 {
		return w, errBadMessage
	}
	w.flags, w.payload = flags, b[k:]
	if len(w.payload) > MaxPayload || w.from == "" {
		return w, errBadMessage
	}
	return w, nil
}
