package modbus

import (
	"strings"
	"testing"
	"time"
)

func TestHeartbeatConfig(t *testing.T) {
	s, err := parseBus(busFrom(t, TypeTCP, `{address: h, timeout_ms: 500,
  heartbeat: {unit: 1, register: 40022, every_ms: 1000, value: counter, timeout_register: 40021, timeout_ms: 5000, timeout_scale_ms: 100}}`), TypeTCP)
	if err != nil {
		t.Fatal(err)
	}
	want := Heartbeat{Unit: 1, Addr: 21, Every: time.Second, Counter: true, Timeout: 5 * time.Second,
		HasTimeoutReg: true, TimeoutAddr: 20, TimeoutScale: 100 * time.Millisecond, TimeoutTicks: 50}
	if s.Heartbeat == nil || *s.Heartbeat != want {
		t.Fatalf("heartbeat %+v\nwant      %+v", s.Heartbeat, want)
	}
	// Defaults: unit 1 on TCP, every second, a counter; no watchdog time.
	s, err = parseBus(busFrom(t, TypeTCP, `{address: h, heartbeat: {register: 400100}}`), TypeTCP)
	if err != nil {
		t.Fatal(err)
	}
	if h := s.Heartbeat; h == nil || h.Unit != 1 || h.Addr != 99 || h.Every != time.Second || !h.Counter || h.HasTimeoutReg || h.Timeout != 0 {
		t.Fatalf("defaults %+v", h)
	}
	// A fixed value; a stated device timeout without a register to write it.
	s, err = parseBus(busFrom(t, TypeRTU, `{port: /dev/x, heartbeat: {unit: 7, register: 40100, value: 0x55AA, every_ms: 500, timeout_ms: 3000}}`), TypeRTU)
	if err != nil {
		t.Fatal(err)
	}
	if h := s.Heartbeat; h.Unit != 7 || h.Counter || h.Value != 0x55AA || h.Every != 500*time.Millisecond || h.Timeout != 3*time.Second || h.HasTimeoutReg {
		t.Fatalf("fixed value %+v", h)
	}
	if s, _ := parseBus(busFrom(t, TypeTCP, `{address: h}`), TypeTCP); s.Heartbeat != nil {
		t.Fatalf("no heartbeat: key, heartbeat %+v", s.Heartbeat)
	}
}

func TestHeartbeatConfigErrors(t *testing.T) {
	const ok = "register: 40022, timeout_register: 40021, timeout_scale_ms: 100"
	cases := []struct{ kind, src, want string }{
		{TypeTCP, `{address: h, heartbeat: {}}`, "m.yml:1:25: buses.plc.heartbeat.register: a heartbeat needs the register it writes; fix: add register:"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, every: 5}}`, `buses.plc.heartbeat.every: unknown key "every"`},
		{TypeTCP, `{address: h, heartbeat: {register: 30022}}`,
			"m.yml:1:36: buses.plc.heartbeat.register: heartbeat register 30022 names an input register; physd writes it, so it must be a holding register (4xxxx); fix: write the holding register in Modicon notation"},
		{TypeTCP, `{address: h, heartbeat: {register: 21}}`, `heartbeat register "21" is not a Modicon register number; fix: write the holding register in Modicon notation, e.g. 40022`},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, every_ms: 50}}`,
			"m.yml:1:53: buses.plc.heartbeat.every_ms: heartbeat every_ms must be between 100 and 60000, got 50; fix: write the heartbeat period in ms"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, every_ms: 60001}}`, "every_ms must be between 100 and 60000, got 60001"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, value: toggle}}`,
			`buses.plc.heartbeat.value: heartbeat value "toggle" is neither counter nor a 16-bit integer; fix: write value: counter`},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, value: 65536}}`, "neither counter nor a 16-bit integer"},
		{TypeTCP, `{address: h, heartbeat: {unit: 256, register: 40022}}`, "buses.plc.heartbeat.unit: heartbeat unit 256 is outside 0..255 for modbus_tcp"},
		{TypeRTU, `{port: /dev/x, heartbeat: {register: 40022}}`, "buses.plc.heartbeat.unit: a modbus_rtu heartbeat needs its unit (slave) id; fix: add unit: N (1..247)"},
		{TypeRTU, `{port: /dev/x, heartbeat: {unit: 0, register: 40022}}`, "heartbeat unit 0 is outside 1..247 for modbus_rtu"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, every_ms: 1000, timeout_ms: 2999}}`,
			"buses.plc.heartbeat.timeout_ms: heartbeat timeout_ms (2999) is less than 3 × every_ms (1000): two late heartbeats would put the device in safe mode; fix: make timeout_ms at least 3000, or every_ms at most 999"},
		{TypeTCP, `{address: h, timeout_ms: 2000, heartbeat: {register: 40022, every_ms: 1000, timeout_ms: 2500}}`, "less than 3 × every_ms"},
		{TypeTCP, `{address: h, timeout_ms: 5000, heartbeat: {register: 40022, every_ms: 1000, timeout_ms: 4000}}`,
			"heartbeat timeout_ms (4000) is less than every_ms (1000) + the bus timeout_ms (5000): one heartbeat that waits out the bus timeout would put the device in safe mode; fix: make heartbeat timeout_ms at least 6000, or lower the bus timeout_ms"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, timeout_register: 40021, timeout_scale_ms: 100}}`,
			"buses.plc.heartbeat.timeout_register: heartbeat timeout_register needs timeout_ms: the watchdog time physd writes there; fix: add timeout_ms"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, timeout_register: 40021, timeout_ms: 5000}}`,
			"heartbeat timeout_register needs timeout_scale_ms: what one count of that register means; fix: add timeout_scale_ms from the device's manual"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, timeout_ms: 5000, timeout_scale_ms: 100}}`,
			"buses.plc.heartbeat.timeout_scale_ms: heartbeat timeout_scale_ms without timeout_register: physd writes no watchdog time; fix: add timeout_register"},
		{TypeTCP, `{address: h, heartbeat: {` + ok + `, timeout_ms: 5050}}`,
			"heartbeat timeout_ms (5050) is not a whole number of timeout_scale_ms (100); fix: use timeout_ms 5000 or 5100"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, timeout_register: 40021, timeout_scale_ms: 1, timeout_ms: 70000}}`,
			"heartbeat timeout_ms / timeout_scale_ms = 70000 does not fit the 16-bit register"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, timeout_register: 40021, timeout_scale_ms: 0, timeout_ms: 5000}}`,
			"heartbeat timeout_scale_ms must be between 1 and 60000, got 0"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, timeout_register: 40022, timeout_scale_ms: 100, timeout_ms: 5000}}`,
			"heartbeat timeout_register is the heartbeat register (40022)"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, timeout_register: 10021, timeout_scale_ms: 100, timeout_ms: 5000}}`,
			"heartbeat timeout_register 10021 names a discrete input"},
		{TypeTCP, `{address: h, heartbeat: {register: 40022, timeout_ms: 0}}`, "heartbeat timeout_ms must be between 1 and 3600000, got 0"},
		{TypeTCP, `{address: h, heartbeat: 5}`, "buses.plc.heartbeat"},
	}
	for _, c := range cases {
		_, err := parseBus(busFrom(t, c.kind, c.src), c.kind)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s:\n  err  %v\n  want %q", c.kind, c.src, err, c.want)
		}
	}
	// Block YAML: the position is the value's line and column.
	_, err := parseBus(busFrom(t, TypeTCP, "address: h\nheartbeat:\n  register: 40022\n  every_ms: 1000\n  timeout_ms: 2000\n"), TypeTCP)
	mustContain(t, err, "m.yml:5:15: buses.plc.heartbeat.timeout_ms: heartbeat timeout_ms (2000) is less than 3 × every_ms (1000)", "fix: make timeout_ms at least 3000")
}
