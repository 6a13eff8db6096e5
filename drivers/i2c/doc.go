// Package i2c is the I²C driver: bus type "i2c", built on periph.io
// (conn/v3 i2creg, host/v3 sysfs-i2c, i.e. /dev/i2c-N through I2C_RDWR).
//
// # Bus
//
//	buses:
//	  i2c1:
//	    type: i2c
//	    bus: "1"          # "1", "/dev/i2c-1", "I2C1" or any name i2creg knows (required)
//	    down_after: 3     # consecutive failed transactions before a device is marked down (default 3)
//
// A bus that does not exist does not stop the daemon: the factory returns an
// error that names the bus and what to check (dtparam=i2c_arm=on, i2c-dev,
// the i2c group), the node marks the bus unavailable, its capabilities read
// quality error and /readyz names it.
//
// # Capability bindings
//
// Register-mapped devices (TMP102, INA219, most ADCs and expanders):
//
//	binding: {type: i2c, bus: i2c1, address: 0x48, register: 0x00,
//	          width: 16, signed: true, byte_order: big, scale: 0.00390625, offset: 0}
//
//	address     7-bit device address, 0x03..0x77 (not the 8-bit "write address")
//	register    8-bit register to read (and, for kind: do, to write)
//	width       8 | 16 | 24 | 32 bits (default 8)
//	signed      two's complement (default false)
//	byte_order  big | little (default big; ignored for width 8)
//	scale       value = raw*scale + offset (default 1); a number or a fraction "175/65535"
//	offset      (default 0)
//
// Command-style sensors (Sensirion SHT3x/SCD4x/SGP and friends): write a
// command, wait, read a frame of 16-bit big-endian words, each optionally
// followed by a CRC byte:
//
//	binding: {type: i2c, bus: i2c1, address: 0x44, command: 0x2400, wait_ms: 15,
//	          read_bytes: 6, crc: sht3x, field: 0, scale: 175/65535, offset: -45}
//
//	command        command code, sent big-endian in its minimal number of bytes
//	command_bytes  1..4, to send leading zero bytes (default: minimal)
//	wait_ms        measurement time between command and read (default 0)
//	read_bytes     frame length: a multiple of 3 with crc: sht3x, of 2 without (required)
//	crc            sht3x (CRC-8, poly 0x31, init 0xFF, per 2-byte word) | none (default none)
//	field          which word of the frame is this value (default 0)
//	signed, scale, offset as above; width and byte_order do not apply
//
// SHT3x single shot, high repeatability: temperature = -45 + 175*raw/65535
// (field 0), humidity = 100*raw/65535 (field 1).
//
// The PhysMCP address string works too, and may carry any of the keys above
// as key=value after the device address, separated by ':' (reg = register,
// cmd = command, order = byte_order):
//
//	address: "0x48:reg=0x00"                       # same as address: 0x48, register: 0x00
//	address: "0x48:reg=0x00:width=16:signed=true"
//	address: "0x44:cmd=0x2400:wait_ms=15:read_bytes=6:crc=sht3x:field=1"
//
// A key may be given in the address string or as a binding key, not both.
//
// # Types and writes
//
// data_type float returns raw*scale+offset; int rounds it; bool is raw != 0
// (no scale or offset). Command-style points are read-only. A register
// point of kind do writes the inverse, raw = (value-offset)/scale rounded;
// a value whose raw form does not fit the width, or whose rounding error
// exceeds the capability's tolerance, is refused with drivers.ErrBadValue
// before anything reaches the bus.
//
// # Concurrency, deadlines, health
//
// One lock per physical bus (shared by every bus entry that names it) is held
// around each device transaction, so a command write, the wait and the read
// are atomic with respect to other devices. Waiting for the lock and the
// wait_ms sleep honour the caller's ctx. A point whose device fails
// down_after transactions in a row reports it through drivers.PointHealth;
// the bus reports a vanished adapter (its i2creg entry or /dev node gone)
// through Health and reopens it when it comes back.
package i2c
