// Package modbus is physd's Modbus driver: bus types modbus_tcp and
// modbus_rtu, with capability bindings of type modbus. cmd/physd enables it
// with a blank import:
//
//	import _ "github.com/physd/physd/drivers/modbus"
//
// # Buses
//
//	buses:
//	  plc1:
//	    type: modbus_tcp
//	    address: "10.0.0.5:502"   # host[:port], port 502 by default
//	    timeout_ms: 1000          # per request (TCP: cut to the callers' deadline; RTU: never)
//	    min_gap_ms: 0             # pause between requests to the same unit
//	    down_after: 3             # consecutive failures that mark a unit down
//	    retry_backoff_ms: 1000    # first retry of a down unit, doubling ...
//	    max_backoff_ms: 30000     # ... up to this
//	    queue_size: 64            # requests waiting; a full queue fails at once
//	    coalesce: true            # merge reads queued together
//	    coalesce_gap: 4           # unused registers (or bits) a merged read may span
//	    busy_retries: 3           # resends after exception 06, within the caller's deadline
//	    busy_backoff_ms: 100      # wait before the first resend, doubling
//	    heartbeat: {unit: 1, register: 40022, every_ms: 1000, value: counter,   # feed the device's host watchdog
//	                timeout_register: 40021, timeout_ms: 5000, timeout_scale_ms: 100}
//	  line1:
//	    type: modbus_rtu
//	    port: /dev/ttyUSB0        # better: /dev/serial/by-id/...
//	    baud: 19200               # 1200 .. 921600
//	    parity: E                 # N | E | O (none/even/odd); default E, as the spec says
//	    stop_bits: 1              # 1 | 2
//	    data_bits: 8              # RTU is always 8
//	    silence_ms: 1000          # quiet line required after an error; default timeout_ms
//	    rs485: {enabled: false, delay_rts_before_send_ms: 0, delay_rts_after_send_ms: 0,
//	            rts_high_during_send: false, rts_high_after_send: false, rx_during_tx: false}
//	    # ... and every key of modbus_tcp except address
//
// The rs485 delays are milliseconds because the kernel's TIOCSRS485 counts
// them so. Open tries one connection (bounded by timeout_ms) so Health is
// right at once, but a modbus_tcp peer that is down at start does not fail
// it: the bus opens, Health names the endpoint, capabilities read quality
// error, and the worker retries on its backoff until the peer answers. A serial
// port that cannot be opened (or refuses RS-485 mode) fails Open.
//
// # Bindings
//
//	binding: {type: modbus, bus: plc1, address: "slave=1:reg=40001:type=holding",
//	          data_type: int16, scale: 0.1}
//	binding: {type: modbus, bus: plc1, unit: 1, table: holding, address: 0,
//	          data_type: float32, byte_order: CDAB, offset: -40, write_function: 16}
//
// Keys: unit (TCP 0..255, default 1; RTU 1..247, required), table
// (coil | discrete | input | holding), address, data_type (int16 uint16
// int32 uint32 int64 uint64 float32 float64 bool bit; default bool on coils
// and discrete inputs, bit when bit: is given, uint16 for bool and enum
// capabilities, otherwise required), bit (0..15, for data_type bit: one
// bit of a register, written by read-modify-write), byte_order (ABCD CDAB
// BADC DCBA, default ABCD; word_order is refused), scale and offset (value =
// raw*scale + offset), write_function (5 or 15 for coils; 6 or 16 for
// holding registers, 16 required for multi-register types), enum_map
// ({name: code}, for enum capabilities; default: the index in
// enum_values), verify (do capabilities: the point that shows the
// command, read instead of the written point for the read-back; verify.go).
//
// The address rule, one for all forms:
//
//   - address: N (decimal or 0x hex) is the 0-based protocol address, the
//     number on the wire; it needs table:. address: 40001 is therefore
//     holding address 40001, not the first holding register.
//   - The PhysMCP address string is key=value pairs joined by ':'. reg=
//     takes Modicon notation only: 5 or 6 digits, 1-based, the first digit
//     naming the table (0 coil, 1 discrete input, 3 input register,
//     4 holding register), so reg=40001 and reg=400001 are holding address
//     0 and reg=30010 is input address 9. addr= takes a 0-based address
//     (and needs type= or table:). slave= (alias unit=) is the unit, type=
//     (alias table=) the table.
//   - Whatever is said twice must agree (reg=40001 with type=coil, or
//     slave=1 with unit: 2, is an error naming both), and errors carry
//     file:line:col.
//
// Capability types map as: float <- any integer or float register, scaled;
// int <- integer registers, with whole-number scale and offset, computed
// exactly (no float rounding, even for 64-bit registers); bool <- coils,
// discrete inputs, bits, or integer registers (non-zero is true); enum <-
// integer registers through enum_map. A write the register cannot hold
// exactly (a fraction for an integer register, out of range, float32
// overflow or underflow) is refused before anything is sent, with an error
// wrapping drivers.ErrBadValue.
//
// # Engine
//
// Files: config.go and binding.go validate the manifest (address.go holds
// the address rule); codec.go and value.go convert registers; worker.go,
// ops.go, exchange.go, coalesce.go and health.go are the engine; tcp.go,
// rtu.go and rtuframe.go are the links; bus.go and point.go the
// drivers.Bus and drivers.Point.
//
// One worker goroutine owns each endpoint (worker.go); nothing else touches
// the connection or the serial port. Points queue requests to it through a
// bounded channel. Each turn the worker takes a request, drains whatever
// else is queued, and runs the batch in arrival order: writes one at a
// time, and each run of reads between two writes merged per unit and table
// into as few requests as the protocol allows (≤125 registers, ≤2000 bits;
// coalesce.go). A write is a barrier, and nothing is cached, so the node's
// read-back after a write always sees the device. A merged read that draws
// an exception (a hole in a gap) is retried point by point.
//
// Per request the worker checks the unit's health (down after down_after
// consecutive failures, then fail fast with drivers.ErrOffline except for
// one probe per backoff step; health.go), waits out the unit's min gap,
// bounds the timeout by the callers' deadlines, and sends. After any error
// that is not a Modbus exception the link recovers before anything else is
// sent: TCP closes goburrow's handler (goburrow v0.1.0 otherwise stays one
// transaction id behind after a timeout, and keeps a broken pipe after a
// peer restart); a request that fails on a connection the peer dropped
// while idle is retried once on a fresh one. Points implement
// drivers.PointHealth, so the node serves a down unit's last value as
// degraded.
//
// Modbus exceptions become *ExceptionError naming the exception, the
// function and the registers. For writes, codes 1–3 wrap ErrBadValue and
// 6 and 10 wrap ErrOffline ("nothing changed"); others leave the outcome
// open for the node's read-back. Errors where nothing reached the wire
// (queue full, unit down, unreachable endpoint, expired while queued) wrap
// drivers.ErrOffline.
//
// # RTU, and why not goburrow's RTU client
//
// TCP uses goburrow/modbus as it is (client, packager, transport). RTU uses
// goburrow's client and RTU packager (PDU encoding, CRC, echo checks) but
// its own transport (rtu.go, rtuframe.go) on a goburrow/serial port,
// because goburrow v0.1.0's RTU transport:
//
//   - recognises exception replies with aduRequest[1]&0x80, which is always
//     0, instead of |0x80: a 5-byte exception is read only when all its
//     bytes happen to arrive in the first read, and otherwise a byte stays
//     on the line to corrupt the next reply;
//   - never flushes and cannot be told to: a reply that arrives after its
//     request timed out is taken, with a valid CRC, as the reply to the
//     next request, a silently wrong value; its port is unexported, so no
//     caller can drain it;
//   - takes no lock, sleeps a computed frame time per request, and has no
//     way to bound one request by the caller's deadline.
//
// The transport frames replies exactly from the request (unit, function,
// byte count, CRC, no trailing bytes), requires one quiet t3.5 gap before
// every send, and after any timeout or error discards input until the line
// has been silent for silence_ms. Known limits: goburrow/serial selects on
// an fd_set, so a port whose file descriptor is ≥ 1024 fails its reads
// (errors, never wrong data); RS-485 mode needs a kernel driver with
// TIOCSRS485 (a pty refuses it).
//
// Bus.Stats counts requests, coalesced reads, failures, rejections, RTU
// flushes and the queue depth, for the daemon's metrics.
//
// Tests run against independent peers (package modbustest): the
// github.com/simonvetter/modbus TCP server, and an RTU slave with its own
// framing and CRC on a creack/pty pair.
package modbus
