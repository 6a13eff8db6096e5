// Package all links every bus driver physd ships into a program: import it
// for its side effect (each driver registers itself with package drivers),
// then read the list from drivers.Types. This file is the one place the
// list of drivers is written.
package all

import (
	_ "github.com/physd/physd/drivers/gpio"    // host GPIO through periph.io
	_ "github.com/physd/physd/drivers/i2c"     // I²C through periph.io
	_ "github.com/physd/physd/drivers/modbus"  // Modbus TCP and RTU
	_ "github.com/physd/physd/drivers/onewire" // 1-Wire through the kernel's w1 sysfs
	_ "github.com/physd/physd/drivers/opcua"   // OPC UA client (gopcua)
	_ "github.com/physd/physd/drivers/pwm"     // PWM through the kernel's sysfs
	_ "github.com/physd/physd/drivers/sim"     // the built-in simulator
	_ "github.com/physd/physd/drivers/spi"     // SPI through periph.io
)
