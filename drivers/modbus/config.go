package modbus

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/goburrow/serial"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/strictyaml"
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
	BusyRetries    *int  `yaml:"busy_retries"`
	BusyBackoffMS  *int  `yaml:"busy_backoff_ms"`

	Heartbeat *heartbeatKeys `yaml:"heartbeat"`
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

const defaultTCPPort = "502"

// Config is every setting of a modbus bus, in the units the worker uses.
// DefaultTCPConfig and DefaultRTUConfig hold the defaults, each with the
// reason for it; the parser starts from them and the bus reference in
// docs/manifest.md is written from them (TestREADMEBusReference keeps the two
// in step).
type Config struct {
	Timeout      time.Duration // timeout_ms: the wait for one reply; RTU adds the frames' time on the wire
	MinGap       time.Duration // min_gap_ms: pause between the end of one request to a unit and the next
	DownAfter    int           // down_after: consecutive failures that mark a unit down
	RetryBackoff time.Duration // retry_backoff_ms: first retry of a down unit, doubling ...
	MaxBackoff   time.Duration // max_backoff_ms: ... up to this
	QueueSize    int           // queue_size: requests waiting for the bus; a full queue fails at once
	Coalesce     bool          // coalesce: merge reads queued together
	CoalesceGap  int           // coalesce_gap: unused registers (or bits) a merged read may span
	BusyRetries  int           // busy_retries: resends after exception 06 (busy), within the caller's deadline
	BusyBackoff  time.Duration // busy_backoff_ms: wait before the first resend, doubling
	Heartbeat    *Heartbeat    // heartbeat: the host heartbeat that feeds the device's watchdog (heartbeat.go); nil: none

	Address string // modbus_tcp address: host:port

	Serial  serial.Config // modbus_rtu port, baud, data_bits, parity, stop_bits, rs485
	Silence time.Duration // modbus_rtu silence_ms: quiet line required after a timeout or stray bytes; 0: Timeout
}

// DefaultTCPConfig is a modbus_tcp bus with every key left out.
func DefaultTCPConfig() Config {
	return Config{
		// A PLC or gateway on a LAN answers in milliseconds; a second
		// covers a gateway that forwards to a slow serial device.
		Timeout:      time.Second,
		MinGap:       0,
		DownAfter:    3, // one lost packet is not an outage; three in a row is
		RetryBackoff: time.Second,
		MaxBackoff:   30 * time.Second,
		QueueSize:    64, // a few polls of a large device; beyond that callers are better told at once
		Coalesce:     true,
		CoalesceGap:  4,
		// Busy (exception 06) means "not done, ask again": a few resends
		// spaced 100, 200, 400 ms fit inside a typical 2 s capability
		// timeout.
		BusyRetries: 3,
		BusyBackoff: 100 * time.Millisecond,
	}
}

// DefaultRTUConfig is a modbus_rtu bus with every key left out: the serial
// line spec's defaults (19200 baud, 8 data bits, even parity, 1 stop bit),
// and a quarantine after errors as long as the timeout, which with the
// re-synchronisation probe keeps slow RS-485 devices' late replies from
// ever answering another request (see the package doc).
func DefaultRTUConfig() Config {
	c := DefaultTCPConfig()
	c.Serial = serial.Config{BaudRate: 19200, DataBits: 8, Parity: "E", StopBits: 1}
	c.Silence = 0 // = Timeout
	return c
}

// silence is the quarantine after an error: silence_ms, else timeout_ms.
func (c *Config) silence() time.Duration {
	if c.Silence > 0 {
		return c.Silence
	}
	return c.Timeout
}

// busSpec is a validated bus entry.
type busSpec struct {
	kind string // TypeTCP or TypeRTU
	name string
	Config
	log *slog.Logger // the heartbeat's logger; nil: slog.Default() (tests set it)
}

func (s *busSpec) endpoint() string {
	if s.kind == TypeTCP {
		return s.Address
	}
	return s.Serial.Address
}

// parseBus decodes and validates a bus entry strictly, starting from the
// type's defaults.
func parseBus(b *manifest.Bus, kind string) (*busSpec, error) {
	root := b.FieldPath()
	cfg := strictyaml.WithoutKey(b.Config, "type")
	p := &strictyaml.Problems{File: b.Pos.File, Root: root, Top: cfg, At: b.Pos}
	spec := &busSpec{kind: kind, name: b.Name}
	var eng engineKeys
	if kind == TypeTCP {
		spec.Config = DefaultTCPConfig()
		var k tcpKeys
		if errs := strictyaml.Decode(b.Pos.File, cfg, root, &k); len(errs) > 0 {
			return nil, errs
		}
		eng = k.engineKeys
		spec.Address = tcpAddress(p, k.Address)
	} else {
		spec.Config = DefaultRTUConfig()
		var k rtuKeys
		if errs := strictyaml.Decode(b.Pos.File, cfg, root, &k); len(errs) > 0 {
			return nil, errs
		}
		eng = k.engineKeys
		parseSerial(p, &k, &spec.Config)
	}
	parseEngine(p, &eng, &spec.Config)
	parseHeartbeat(p, eng.Heartbeat, kind, &spec.Config)
	if err := p.Err(); err != nil {
		return nil, err
	}
	return spec, nil
}

// parseEngine applies the worker's keys, shared by both bus types.
func parseEngine(p *strictyaml.Problems, eng *engineKeys, c *Config) {
	ms := func(v *int, into *time.Duration, lo, hi int, fix, key string) {
		if v == nil {
			return
		}
		if *v < lo || *v > hi {
			p.Add(fmt.Sprintf("%s must be between %d and %d, got %d", key, lo, hi, *v), fix, key)
			return
		}
		*into = time.Duration(*v) * time.Millisecond
	}
	num := func(v *int, into *int, lo, hi int, fix, key string) {
		if v == nil {
			return
		}
		if *v < lo || *v > hi {
			p.Add(fmt.Sprintf("%s must be between %d and %d, got %d", key, lo, hi, *v), fix, key)
			return
		}
		*into = *v
	}
	ms(eng.TimeoutMS, &c.Timeout, 1, 60_000, "the longest a device may take to answer, e.g. 1000", "timeout_ms")
	ms(eng.MinGapMS, &c.MinGap, 0, 10_000, "a pause in ms between requests to the same unit, e.g. 20 (0 for none)", "min_gap_ms")
	num(eng.DownAfter, &c.DownAfter, 1, 1000, "the number of consecutive failures that mark a unit down, e.g. 3", "down_after")
	ms(eng.RetryBackoffMS, &c.RetryBackoff, 1, 3_600_000, "the first retry delay of a down unit in ms, e.g. 1000", "retry_backoff_ms")
	if eng.MaxBackoffMS == nil {
		c.MaxBackoff = max(c.MaxBackoff, c.RetryBackoff)
	}
	ms(eng.MaxBackoffMS, &c.MaxBackoff, 1, 3_600_000, "the longest retry delay in ms, e.g. 30000", "max_backoff_ms")
	if c.MaxBackoff < c.RetryBackoff {
		p.Add(fmt.Sprintf("max_backoff_ms (%d) is below retry_backoff_ms (%d)", c.MaxBackoff.Milliseconds(), c.RetryBackoff.Milliseconds()),
			"make max_backoff_ms at least retry_backoff_ms", "max_backoff_ms")
	}
	num(eng.QueueSize, &c.QueueSize, 1, 100_000, "the most requests waiting for the bus, e.g. 64", "queue_size")
	if eng.Coalesce != nil {
		c.Coalesce = *eng.Coalesce
	}
	num(eng.CoalesceGap, &c.CoalesceGap, 0, 100,
		"how many unused registers (or bits) a merged read may span between two points, e.g. 4 (0: only adjacent)", "coalesce_gap")
	num(eng.BusyRetries, &c.BusyRetries, 0, 100, "how often to resend a request the device answered busy (exception 06), e.g. 3 (0: never)", "busy_retries")
	ms(eng.BusyBackoffMS, &c.BusyBackoff, 1, 60_000, "the wait in ms before the first resend to a busy device, e.g. 100", "busy_backoff_ms")
}

func tcpAddress(p *strictyaml.Problems, a *string) string {
	fix := `write the device's host and port, e.g. address: "10.0.0.5:502"`
	if a == nil || strings.TrimSpace(*a) == "" {
		p.Add("a modbus_tcp bus needs an address", fix, "address")
		return ""
	}
	s := strings.TrimSpace(*a)
	s = strings.TrimPrefix(s, "tcp://")
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		// No port: the Modbus TCP default.
		host, port = s, defaultTCPPort
		if strings.Count(s, ":") > 1 && !strings.HasPrefix(s, "[") {
			p.Add(fmt.Sprintf("address %q: IPv6 hosts need brackets", *a), `write e.g. "[fd00::5]:502"`, "address")
			return ""
		}
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
		p.Add(fmt.Sprintf("address %q is not host:port", *a), fix, "address")
		return ""
	}
	return net.JoinHostPort(host, port)
}

var (
	parities  = []string{"N", "E", "O"}
	baudRates = []int{1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200, 230400, 460800, 921600}
)

func parseSerial(p *strictyaml.Problems, k *rtuKeys, cfg *Config) {
	c := &cfg.Serial
	if k.Port == nil || strings.TrimSpace(*k.Port) == "" {
		p.Add("a modbus_rtu bus needs a serial port", "write e.g. port: /dev/ttyUSB0 (a stable name from /dev/serial/by-id/ is better)", "port")
	} else {
		c.Address = strings.TrimSpace(*k.Port)
	}
	if k.Baud != nil {
		c.BaudRate = *k.Baud
		ok := false
		for _, b := range baudRates {
			ok = ok || b == *k.Baud
		}
		if !ok {
			p.Add(fmt.Sprintf("unsupported baud %d", *k.Baud), fmt.Sprintf("use one of %v", baudRates), "baud")
		}
	}
	if k.DataBits != nil && *k.DataBits != 8 {
		p.Add(fmt.Sprintf("data_bits %d: Modbus RTU uses 8 data bits", *k.DataBits), "use data_bits: 8 (7 is Modbus ASCII, which physd does not speak)", "data_bits")
	}
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
			p.Add(fmt.Sprintf("unknown parity %q", *k.Parity), oneOf(parities)+" (none, even, odd)", "parity")
		}
	}
	if k.StopBits != nil {
		c.StopBits = *k.StopBits
		if c.StopBits != 1 && c.StopBits != 2 {
			p.Add(fmt.Sprintf("stop_bits must be 1 or 2, got %d", *k.StopBits), "use stop_bits: 1 (or 2 with parity N, as the spec asks)", "stop_bits")
		}
	}
	if k.SilenceMS != nil {
		if *k.SilenceMS < 1 || *k.SilenceMS > 60_000 {
			p.Add(fmt.Sprintf("silence_ms must be between 1 and 60000, got %d", *k.SilenceMS),
				"use at least the slowest reply you expect from any unit on this line, in ms (default: timeout_ms)", "silence_ms")
		} else {
			cfg.Silence = time.Duration(*k.SilenceMS) * time.Millisecond
		}
	}
	if r := k.RS485; r != nil {
		c.RS485.Enabled = r.Enabled != nil && *r.Enabled
		delay := func(v *int, key string) time.Duration {
			if v == nil {
				return 0
			}
			if *v < 0 || *v > 1000 {
				p.Add(fmt.Sprintf("%s must be between 0 and 1000, got %d", key, *v), "use the transceiver's RTS delay in milliseconds, usually 0", "rs485", key)
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
		baud = DefaultRTUConfig().Serial.BaudRate
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
