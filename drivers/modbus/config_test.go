package modbus

import (
	"strings"
	"testing"
	"time"
)

func TestBusConfigDefaults(t *testing.T) {
	s, err := parseBus(busFrom(t, TypeTCP, `{address: 10.0.0.5}`), TypeTCP)
	if err != nil {
		t.Fatal(err)
	}
	if s.Address != "10.0.0.5:502" || s.Timeout != time.Second || s.DownAfter != 3 || s.RetryBackoff != time.Second ||
		s.MaxBackoff != 30*time.Second || s.QueueSize != 64 || !s.Coalesce || s.CoalesceGap != 4 || s.MinGap != 0 {
		t.Fatalf("tcp defaults %+v", s)
	}
	s, err = parseBus(busFrom(t, TypeRTU, `{port: /dev/ttyUSB0, timeout_ms: 300, rs485: {enabled: true, delay_rts_before_send_ms: 2}}`), TypeRTU)
	if err != nil {
		t.Fatal(err)
	}
	c := s.Serial
	if c.Address != "/dev/ttyUSB0" || c.BaudRate != 19200 || c.Parity != "E" || c.StopBits != 1 || c.DataBits != 8 ||
		s.silence() != 300*time.Millisecond || !c.RS485.Enabled || c.RS485.DelayRtsBeforeSend != 2*time.Millisecond {
		t.Fatalf("rtu defaults %+v", s)
	}
	if g := frameGap(9600); g < 4*time.Millisecond || g > 4100*time.Microsecond {
		t.Errorf("t3.5 at 9600 = %v, want about 4.01ms", g)
	}
	if g := frameGap(115200); g != 1750*time.Microsecond {
		t.Errorf("t3.5 at 115200 = %v, want 1.75ms", g)
	}
}

func TestBusConfigErrors(t *testing.T) {
	cases := []struct{ kind, src, want string }{
		{TypeTCP, `{}`, "buses.plc.address: a modbus_tcp bus needs an address"},
		{TypeTCP, `{address: "host:99999"}`, "is not host:port"},
		{TypeTCP, `{address: "fd00::5"}`, "IPv6 hosts need brackets"},
		{TypeTCP, `{address: h, timeout_ms: 0}`, "timeout_ms must be between 1 and 60000"},
		{TypeTCP, `{address: h, timeout: 5}`, `did you mean "timeout_ms"`},
		{TypeTCP, `{address: h, retry_backoff_ms: 5000, max_backoff_ms: 1000}`, "max_backoff_ms (1000) is below retry_backoff_ms (5000)"},
		{TypeTCP, `{address: h, queue_size: 0}`, "queue_size must be between 1"},
		{TypeTCP, `{address: h, port: /dev/ttyS0}`, `unknown key "port"`},
		{TypeRTU, `{baud: 9600}`, "needs a serial port"},
		{TypeRTU, `{port: /dev/x, baud: 12345}`, "unsupported baud 12345"},
		{TypeRTU, `{port: /dev/x, parity: X}`, `unknown parity "X"`},
		{TypeRTU, `{port: /dev/x, stop_bits: 3}`, "stop_bits must be 1 or 2"},
		{TypeRTU, `{port: /dev/x, data_bits: 7}`, "Modbus RTU uses 8 data bits"},
		{TypeRTU, `{port: /dev/x, silence_ms: 0}`, "silence_ms must be between 1"},
		{TypeRTU, `{port: /dev/x, rs485: {delay_rts_before_send_us: 5}}`, `unknown key "delay_rts_before_send_us"`},
		{TypeRTU, `{port: /dev/x, rs485: {delay_rts_after_send_ms: 5000}}`, "buses.plc.rs485.delay_rts_after_send_ms"},
	}
	for _, c := range cases {
		_, err := parseBus(busFrom(t, c.kind, c.src), c.kind)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s:\n  err  %v\n  want %q", c.kind, c.src, err, c.want)
		}
	}
	_, err := parseBus(busFrom(t, TypeTCP, "address: h\ntimeout_ms: -1\n"), TypeTCP)
	mustContain(t, err, "m.yml:2:13: buses.plc.timeout_ms")
}
