package modbus

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/goburrow/serial"
	"github.com/physd/physd/manifest"
)

// Bus types this package registers.
const (
	TypeTCP = "modbus_tcp"
	TypeRTU = "modbus_rtu"
)

// engineKeys are the worker's keys, shared by both bus types.
type engineKeys struct {
	TimeoutMS      *int  `yaml:"timeout_ms"`
	MinGapMS       *int  `yaml:"min_gap_ms"`
	DownAfter      *int  `yaml:"down_after"`
	RetryBackoffMS *int  `yaml:"retry_backoff_ms"`
	MaxBackoffMS   *int  `yaml:"max_backoff_ms"`
	QueueSize      *int  `yaml:"queue_size"`
	Coalesce       *bool `yaml:"coalesce"`
	CoalesceGap    *int  `yaml:"coalesce_gap"`
}

type tcpKeys struct {
	Address    *string `yaml:"address"`
	engineKeys `yaml:",inline"`
}

type rtuKeys struct {
	Port       *string    `yaml:"port"`
	Baud       *int       `yaml:"baud"`
	DataBits   *int       `yaml:"data_bits"`
	Parity     *string    `yaml:"parity"`
	StopBits   *int       `yaml:"stop_bits"`
	SilenceMS  *int       `yaml:"silence_ms"`
	RS485      *rs485Keys `yaml:"rs485"`
	engineKeys `yaml:",inline"`
}

// rs485Keys mirror the kernel's struct serial_rs485 (TIOCSRS485), which
// counts its RTS delays in milliseconds, hence _ms.
type rs485Keys struct {
	Enabled              *bool `yaml:"enabled"`
	DelayRTSBeforeSendMS *int  `yaml:"delay_rts_before_send_ms"`
	DelayRTSAfterSendMS  *int  `yaml:"delay_rts_after_send_ms"`
	RTSHighDuringSend    *bool `yaml:"rts_high_during_send"`
	RTSHighAfterSend     *bool `yaml:"rts_high_after_send"`
	RxDuringTx           *bool `yaml:"rx_during_tx"`
}

// Defaults.
const (
	defaultTimeout     = time.Second
	defaultDownAfter   = 3
	defaultBackoff     = time.Second
	defaultMaxBackoff  = 30 * time.Second
	defaultQueueSize   = 64
	defaultCoalesceGap = 4
	defaultTCPPort     = "502"
	defaultBaud        = 19200 // the Modbus serial line spec's default
)

// busSpec is a validated bus entry.
type busSpec struct {
	kind string // TypeTCP or TypeRTU
	name string

	timeout     time.Duration // per request
	minGap      time.Duration // per unit, between the end of one request and the next
	downAfter   int
	backoff     time.Duration
	maxBackoff  time.Duration
	queueSize   int
	coalesce    bool
	coalesceGap int

	address string        // TCP host:port
	serial  serial.Config // RTU; Timeout is set by the transport
	silence time.Duration // RTU: quiet line required after an error
}

func (s *busSpec) endpoint() string {
	if s.kind == TypeTCP {
		return s.address
	}
	return s.serial.Address
}

// parseBus decodes and validates a bus entry strictly.
func parseBus(b *manifest.Bus, kind string) (*busSpec, error) {
	root := b.FieldPath()
	cfg := manifest.WithoutKey(b.Config, "type")
	p := &problems{file: b.Pos.File, root: root, top: cfg, at: b.Pos}
	spec := &busSpec{kind: kind, name: b.Name}
	var eng engineKeys
	if kind == TypeTCP {
		var k tcpKeys
		if errs := manifest.DecodeNode(b.Pos.File, cfg, root, &k); len(errs) > 0 {
			return nil, errs
		}
		eng = k.engineKeys
		spec.address = tcpAddress(p, k.Address)
	} else {
		var k rtuKeys
		if errs := manifest.DecodeNode(b.Pos.File, cfg, root, &k); len(errs) > 0 {
			return nil, errs
		}
		eng = k.engineKeys
		parseSerial(p, &k, spec)
	}
	ms := func(v *int, def time.Duration, lo, hi int, fix, key string) time.Duration {
		if v == nil {
			return def
		}
		if *v < lo || *v > hi {
			p.add(fmt.Sprintf("%s must be between %d and %d, got %d", key, lo, hi, *v), fix, key)
			return def
		}
		return time.Duration(*v) * time.Millisecond
	}
	num := func(v *int, def, lo, hi int, fix, key string) int {
		if v == nil {
			return def
		}
		if *v < lo || *v > hi {
			p.add(fmt.Sprintf("%s must be between %d and %d, got %d", key, lo, hi, *v), fix, key)
			return def
		}
		return *v
	}
	spec.timeout = ms(eng.TimeoutMS, defaultTimeout, 1, 60_000, "the longest a request may take, e.g. 1000", "timeout_ms")
	spec.minGap = ms(eng.MinGapMS, 0, 0, 10_000, "a pause in ms between requests to the same unit, e.g. 20 (0 for none)", "min_gap_ms")
	spec.downAfter = num(eng.DownAfter, defaultDownAfter, 1, 1000, "the number of consecutive failures that mark a unit down, e.g. 3", "down_after")
	spec.backoff = ms(eng.RetryBackoffMS, defaultBackoff, 1, 3_600_000, "the first retry delay of a down unit in ms, e.g. 1000", "retry_backoff_ms")
	spec.maxBackoff = ms(eng.MaxBackoffMS, max(defaultMaxBackoff, spec.backoff), 1, 3_600_000, "the longest retry delay in ms, e.g. 30000", "max_backoff_ms")
	if spec.maxBackoff < spec.backoff {
		p.add(fmt.Sprintf("max_backoff_ms (%d) is below retry_backoff_ms (%d)", spec.maxBackoff.Milliseconds(), spec.backoff.Milliseconds()),
			"make max_backoff_ms at least retry_backoff_ms", "max_backoff_ms")
	}
	spec.queueSize = num(eng.QueueSize, defaultQueueSize, 1, 100_000, "the most requests waiting for the bus, e.g. 64", "queue_size")
	spec.coalesce = eng.Coalesce == nil || *eng.Coalesce
	spec.coalesceGap = num(eng.CoalesceGap, defaultCoalesceGap, 0, 100,
		"how many unused registers (or bits) a merged read may span between two points, e.g. 4 (0: only adjacent)", "coalesce_gap")
	if kind == TypeRTU && spec.silence == 0 {
		spec.silence = spec.timeout
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return spec, nil
}

func tcpAddress(p *problems, a *string) string {
	fix := `write the device's host and port, e.g. address: "10.0.0.5:502"`
	if a == nil || strings.TrimSpace(*a) == "" {
		p.add("a modbus_tcp bus needs an address", fix, "address")
		return ""
	}
	s := strings.TrimSpace(*a)
	s = strings.TrimPrefix(s, "tcp://")
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		// No port: the Modbus TCP default.
		host, port = s, defaultTCPPort
		if strings.Count(s, ":") > 1 && !strings.HasPrefix(s, "[") {
			p.add(fmt.Sprintf("address %q: IPv6 hosts need brackets", *a), `write e.g. "[fd00::5]:502"`, "address")
			return ""
		}
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
		p.add(fmt.Sprintf("address %q is not host:port", *a), fix, "address")
		return ""
	}
	return net.JoinHostPort(host, port)
}

var (
	parities  = []string{"N", "E", "O"}
	baudRates = []int{1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200, 230400, 460800, 921600}
)

func parseSerial(p *problems, k *rtuKeys, spec *busSpec) {
	c := &spec.serial
	if k.Port == nil || strings.TrimSpace(*k.Port) == "" {
		p.add("a modbus_rtu bus needs a serial port", "write e.g. port: /dev/ttyUSB0 (a stable name from /dev/serial/by-id/ is better)", "port")
	} else {
		c.Address = strings.TrimSpace(*k.Port)
	}
	c.BaudRate = defaultBaud
	if k.Baud != nil {
		c.BaudRate = *k.Baud
		ok := false
		for _, b := range baudRates {
			ok = ok || b == *k.Baud
		}
		if !ok {
			p.add(fmt.Sprintf("unsupported baud %d", *k.Baud), fmt.Sprintf("use one of %v", baudRates), "baud")
		}
	}
	c.DataBits = 8
	if k.DataBits != nil && *k.DataBits != 8 {
		p.add(fmt.Sprintf("data_bits %d: Modbus RTU uses 8 data bits", *k.DataBits), "use data_bits: 8 (7 is Modbus ASCII, which physd does not speak)", "data_bits")
	}
	c.Parity = "E" // the serial line spec's default
	if k.Parity != nil {
		c.Parity = strings.ToUpper(strings.TrimSpace(*k.Parity))
		switch c.Parity {
		case "NONE":
			c.Parity = "N"
		case "EVEN":
			c.Parity = "E"
		case "ODD":
			c.Parity = "O"
		}
		if c.Parity != "N" && c.Parity != "E" && c.Parity != "O" {
			p.add(fmt.Sprintf("unknown parity %q", *k.Parity), oneOf(parities)+" (none, even, odd)", "parity")
		}
	}
	c.StopBits = 1
	if k.StopBits != nil {
		c.StopBits = *k.StopBits
		if c.StopBits != 1 && c.StopBits != 2 {
			p.add(fmt.Sprintf("stop_bits must be 1 or 2, got %d", *k.StopBits), "use stop_bits: 1 (or 2 with parity N, as the spec asks)", "stop_bits")
		}
	}
	if k.SilenceMS != nil {
		if *k.SilenceMS < 1 || *k.SilenceMS > 60_000 {
			p.add(fmt.Sprintf("silence_ms must be between 1 and 60000, got %d", *k.SilenceMS),
				"use at least the slowest reply you expect from any unit on this line, in ms (default: timeout_ms)", "silence_ms")
		} else {
			spec.silence = time.Duration(*k.SilenceMS) * time.Millisecond
		}
	}
	if r := k.RS485; r != nil {
		c.RS485.Enabled = r.Enabled != nil && *r.Enabled
		delay := func(v *int, key string) time.Duration {
			if v == nil {
				return 0
			}
			if *v < 0 || *v > 1000 {
				p.add(fmt.Sprintf("%s must be between 0 and 1000, got %d", key, *v), "use the transceiver's RTS delay in milliseconds, usually 0", "rs485", key)
				return 0
			}
			return time.Duration(*v) * time.Millisecond
		}
		c.RS485.DelayRtsBeforeSend = delay(r.DelayRTSBeforeSendMS, "delay_rts_before_send_ms")
		c.RS485.DelayRtsAfterSend = delay(r.DelayRTSAfterSendMS, "delay_rts_after_send_ms")
		c.RS485.RtsHighDuringSend = r.RTSHighDuringSend != nil && *r.RTSHighDuringSend
		c.RS485.RtsHighAfterSend = r.RTSHighAfterSend != nil && *r.RTSHighAfterSend
		c.RS485.RxDuringTx = r.RxDuringTx != nil && *r.RxDuringTx
	}
}

// charTime is the time one 11-bit character takes on the line (the serial
// line spec counts 11 bits whatever the parity).
func charTime(baud int) time.Duration {
	if baud <= 0 {
		baud = defaultBaud
	}
	return time.Duration(11 * int64(time.Second) / int64(baud))
}

// frameGap is t3.5, the silence that separates RTU frames: 3.5 character
// times, fixed at 1.75 ms above 19200 baud (serial line spec §2.5.1.1).
func frameGap(baud int) time.Duration {
	if baud > 19200 {
		return 1750 * time.Microsecond
	}
	return charTime(baud) * 7 / 2
}
