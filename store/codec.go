package store

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// A done ledger record:
//
//	format(1) | uvarint len + tool | hashKind(1) | uvarint len + hash | answer
//
// format 1: the answer is raw DEFLATE against dictV1. The replay of a key
// must be byte for byte the answer first sent, and DEFLATE is lossless;
// the dictionary (the field names and stock phrases of do_ answers) takes a
// ~1 KB answer to ~250 bytes. dictV1 must never change: a new dictionary is
// a new format byte.
const formatDeflateV1 = 1

const (
	hashRaw = 0 // the hash string as is
	hashHex = 1 // a hex string stored as its bytes (half the size)
)

var dictV1 = []byte(`{"status":"failed","idempotency_key":"","compensable":false,"compensation_hint":null,` +
	`"applied_value":null,"previous_value":null,"side_effects":[],"capability":"do_","source":"","requested_value":` +
	`,"verified":false,"permission":"rate_limited","code":"outcome_unknown","reason":"","details":"retry_after_ms=` +
	`"policy":{"configured":false,"decision":"not_evaluated","note":"no physmcp.policy.yml is configured: ` +
	`only the manifest's data type and range were enforced; its rate_limit, requires_permission, cooldown_ms and ` +
	`requires_quorum are not enforced and no approval gate ran"},"audit":{"seq":` +
	`{"status":"partial","code":"mismatch","reason":"the read-back shows , neither the requested nor the previous value; ` +
	`read the device before you retry","details":"read_back=` +
	`"gate":{"decision":"allow","layer":"L0","reason":"L0 allow rule ","engine":"phocinae-l0","fingerprint":"sha256:` +
	`"policy":{"configured":true,"decision":"allowed"},"permission":"allowed","verified":true,` +
	`{"status":"success","idempotency_key":"","compensable":true,"compensation_hint":"do_ value=","timestamp":"` +
	`T00:00:00.000000000Z","applied_value":`)

// encoder is one DEFLATE writer, reused: records are encoded inside bbolt
// write transactions, which run one at a time anyway. BestSpeed: on a
// ~1 KB answer with the dictionary it is within a few bytes of
// BestCompression at a sixth of the CPU (the higher levels clear ~640 KB
// of hash tables per record).
var encoder struct {
	sync.Mutex
	w *flate.Writer
}

func encodeDone(e *LedgerEntry) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte(formatDeflateV1)
	writeString(&b, e.Tool)
	if h, err := hex.DecodeString(e.ArgsHash); err == nil && len(e.ArgsHash) > 0 {
		b.WriteByte(hashHex)
		writeString(&b, string(h))
	} else {
		b.WriteByte(hashRaw)
		writeString(&b, e.ArgsHash)
	}
	encoder.Lock()
	defer encoder.Unlock()
	if encoder.w == nil {
		w, err := flate.NewWriterDict(&b, flate.BestSpeed, dictV1)
		if err != nil {
			return nil, err
		}
		encoder.w = w
	} else {
		encoder.w.Reset(&b)
	}
	if _, err := encoder.w.Write(e.Response); err != nil {
		return nil, err
	}
	if err := encoder.w.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// readers are DEFLATE readers (≈40 KB of state each), reused across
// lookups, which run concurrently.
var readers = sync.Pool{New: func() any { return flate.NewReaderDict(bytes.NewReader(nil), dictV1) }}

func decodeDone(key string, ts, v []byte) (*LedgerEntry, error) {
	bad := func(what string) error { return fmt.Errorf("ledger: record of %q: %s", key, what) }
	r := bytes.NewReader(v)
	format, err := r.ReadByte()
	if err != nil || format != formatDeflateV1 {
		return nil, bad(fmt.Sprintf("unknown format %d (written by a newer physd?)", format))
	}
	tool, err := readString(r)
	if err != nil {
		return nil, bad("tool: " + err.Error())
	}
	kind, err := r.ReadByte()
	if err != nil {
		return nil, bad("hash kind")
	}
	hash, err := readString(r)
	if err != nil {
		return nil, bad("hash: " + err.Error())
	}
	if kind == hashHex {
		hash = hex.EncodeToString([]byte(hash))
	}
	fr := readers.Get().(io.ReadCloser)
	defer readers.Put(fr)
	if err := fr.(flate.Resetter).Reset(r, dictV1); err != nil {
		return nil, bad("answer: " + err.Error())
	}
	resp, err := io.ReadAll(fr)
	if err != nil {
		return nil, bad("answer: " + err.Error())
	}
	return &LedgerEntry{
		Key: key, Tool: tool, ArgsHash: hash, State: StateDone,
		Created:  time.Unix(0, int64(binary.BigEndian.Uint64(ts))),
		Response: resp,
	}, nil
}

func writeString(b *bytes.Buffer, s string) {
	var n [binary.MaxVarintLen64]byte
	b.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	b.WriteString(s)
}

func readString(r *bytes.Reader) (string, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return "", err
	}
	if n > uint64(r.Len()) {
		return "", errors.New("length past the end of the record")
	}
	buf := make([]byte, n)
	_, err = io.ReadFull(r, buf)
	return string(buf), err
}
