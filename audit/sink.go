package audit

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// RemoteSink forwards audit lines to syslog or an HTTP endpoint from one
// goroutine with a bounded queue. A full queue drops the line (and counts
// it): forwarding never slows or fails an actuation, and the local file,
// fsynced first, stays the record of truth.
type RemoteSink struct {
	queue   chan []byte
	send    func([]byte) error
	closeFn func() error
	done    chan struct{}
	once    sync.Once

	Dropped atomic.Uint64 // lines not queued because the queue was full
	Failed  atomic.Uint64 // lines the remote end did not take
}

// NewRemoteSink connects a sink of type "syslog" (address "udp://host:514",
// "tcp://host:514" or "" for the local syslog) or "http" (a URL that
// accepts POSTed JSON lines).
func NewRemoteSink(kind, address string) (*RemoteSink, error) {
	s := &RemoteSink{queue: make(chan []byte, 1024), done: make(chan struct{}), closeFn: func() error { return nil }}
	switch kind {
	case "syslog":
		network, raddr := "", ""
		if address != "" {
			u, err := url.Parse(address)
			if err != nil || (u.Scheme != "udp" && u.Scheme != "tcp") {
				return nil, fmt.Errorf("audit.remote_sink.address %q: use udp://host:514 or tcp://host:514", address)
			}
			network, raddr = u.Scheme, u.Host
		}
		send, closeFn, err := dialSyslog(network, raddr)
		if err != nil {
			return nil, fmt.Errorf("audit.remote_sink: syslog %s: %w", address, err)
		}
		s.send, s.closeFn = send, closeFn
	case "http":
		u, err := url.Parse(address)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("audit.remote_sink.address %q: use an http(s) URL", address)
		}
		client := &http.Client{Timeout: 5 * time.Second}
		s.send = func(line []byte) error {
			resp, err := client.Post(address, "application/x-ndjson", bytes.NewReader(line))
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				return fmt.Errorf("HTTP %d", resp.StatusCode)
			}
			return nil
		}
	default:
		return nil, fmt.Errorf("audit.remote_sink.type %q: physd forwards to syslog or http", kind)
	}
	go s.run()
	return s, nil
}

func (s *RemoteSink) run() {
	defer close(s.done)
	for line := range s.queue {
		if err := s.send(line); err != nil {
			s.Failed.Add(1)
		}
	}
}

// Send queues a line without blocking.
func (s *RemoteSink) Send(line []byte) {
	select {
	case s.queue <- line:
	default:
		s.Dropped.Add(1)
	}
}

// Close forwards what is queued (waiting at most 5 s) and closes.
func (s *RemoteSink) Close() error {
	s.once.Do(func() { close(s.queue) })
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
	}
	return s.closeFn()
}
