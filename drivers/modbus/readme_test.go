package modbus

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// yamlKeys lists the yaml keys of a bus keys struct (inline structs
// flattened, nested structs as parent.key).
func yamlKeys(t reflect.Type, prefix string) []string {
	var out []string
	for f := range t.Fields() {
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case opts == "inline":
			out = append(out, yamlKeys(ft, prefix)...)
		case ft.Kind() == reflect.Struct:
			out = append(out, yamlKeys(ft, prefix+name+".")...)
		default:
			out = append(out, prefix+name)
		}
	}
	return out
}

// TestREADMEBusReference: the bus table of docs/manifest.md (it was the
// README's) lists every key the parser takes, for the right bus type, with
// the default the parser starts from.
func TestREADMEBusReference(t *testing.T) {
	b, err := os.ReadFile("../../docs/manifest.md")
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ bus, def string }
	rows := map[string]row{}
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		key := strings.Trim(strings.TrimSpace(cells[1]), "`")
		bus := strings.TrimSpace(cells[2])
		if bus != "tcp" && bus != "rtu" && bus != "both" {
			continue // another table
		}
		rows[key] = row{bus, strings.Trim(strings.TrimSpace(cells[3]), "`")}
	}
	tcp, rtu := DefaultTCPConfig(), DefaultRTUConfig()
	ms := func(d time.Duration) string { return fmt.Sprint(d.Milliseconds()) }
	want := map[string]string{
		"address": "required", "port": "required",
		"baud": fmt.Sprint(rtu.Serial.BaudRate), "data_bits": fmt.Sprint(rtu.Serial.DataBits),
		"parity": rtu.Serial.Parity, "stop_bits": fmt.Sprint(rtu.Serial.StopBits),
		"rs485.enabled":                  fmt.Sprint(rtu.Serial.RS485.Enabled),
		"rs485.delay_rts_before_send_ms": ms(rtu.Serial.RS485.DelayRtsBeforeSend),
		"rs485.delay_rts_after_send_ms":  ms(rtu.Serial.RS485.DelayRtsAfterSend),
		"rs485.rts_high_during_send":     fmt.Sprint(rtu.Serial.RS485.RtsHighDuringSend),
		"rs485.rts_high_after_send":      fmt.Sprint(rtu.Serial.RS485.RtsHighAfterSend),
		"rs485.rx_during_tx":             fmt.Sprint(rtu.Serial.RS485.RxDuringTx),
		"timeout_ms":                     ms(tcp.Timeout), "min_gap_ms": ms(tcp.MinGap), "down_after": fmt.Sprint(tcp.DownAfter),
		"retry_backoff_ms": ms(tcp.RetryBackoff), "max_backoff_ms": ms(tcp.MaxBackoff), "queue_size": fmt.Sprint(tcp.QueueSize),
		"coalesce": fmt.Sprint(tcp.Coalesce), "coalesce_gap": fmt.Sprint(tcp.CoalesceGap),
		"busy_retries": fmt.Sprint(tcp.BusyRetries), "busy_backoff_ms": ms(tcp.BusyBackoff),
		// The heartbeat's keys (heartbeat.go): off unless given.
		"heartbeat.unit": "1 on tcp, required on rtu", "heartbeat.register": "required",
		"heartbeat.every_ms": ms(defaultHeartbeatEvery), "heartbeat.value": heartbeatCounter,
		"heartbeat.timeout_register": "none", "heartbeat.timeout_ms": "none",
		"heartbeat.timeout_scale_ms": "required with timeout_register",
	}
	if tcp.Heartbeat != nil || rtu.Heartbeat != nil {
		t.Fatal("a bus without heartbeat: has a heartbeat: the docs/manifest.md table says it is off unless given")
	}
	if rtu.Silence == 0 {
		want["silence_ms"] = "timeout_ms"
	} else {
		want["silence_ms"] = ms(rtu.Silence)
	}
	if rtu.Timeout != tcp.Timeout || rtu.BusyRetries != tcp.BusyRetries || rtu.QueueSize != tcp.QueueSize {
		t.Fatal("the shared keys' defaults differ between TCP and RTU: give the docs/manifest.md table one row per bus type")
	}
	bus := map[string]string{}
	for _, k := range yamlKeys(reflect.TypeFor[tcpKeys](), "") {
		bus[k] = "tcp"
	}
	for _, k := range yamlKeys(reflect.TypeFor[rtuKeys](), "") {
		if bus[k] == "tcp" {
			bus[k] = "both"
		} else {
			bus[k] = "rtu"
		}
	}
	for key, kind := range bus {
		r, ok := rows[key]
		switch {
		case !ok:
			t.Errorf("docs/manifest.md's bus table has no row for %s", key)
		case r.bus != kind:
			t.Errorf("docs/manifest.md: %s is for %s, the table says %s", key, kind, r.bus)
		case r.def != want[key]:
			t.Errorf("docs/manifest.md: %s defaults to %q, the table says %q", key, want[key], r.def)
		}
	}
	for key := range rows {
		if _, ok := bus[key]; !ok {
			t.Errorf("docs/manifest.md's bus table lists %s, which is not a bus key", key)
		}
	}
}
