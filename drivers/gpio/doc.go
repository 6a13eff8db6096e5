// Package gpio is the GPIO driver: bus type "gpio", the host's GPIO lines
// through periph.io (conn/v3 gpioreg; host/v3 gpioioctl and bcm283x).
//
// # Bus
//
//	buses:
//	  gpio: {type: gpio}     # no other keys
//
// Opening it runs periph's host.Init; a host with no GPIO lines at all is an
// error (the node marks the bus unavailable and /readyz names it). A single
// pin that does not exist does not stop the daemon either: its capability
// reads quality error, and the bus's Health (so /readyz) names the pin.
//
// # Capability bindings
//
//	binding: {type: gpio, bus: gpio, pin: GPIO17, direction: out, active_low: true, initial: low}
//	binding: {type: gpio, bus: gpio, pin: 27, pull: up}
//	binding: {type: gpio, bus: gpio, pin: GPIO22, pull: up, edge_count: {edge: falling, debounce_ms: 2}}
//
//	pin         GPIO17 | 17 (the BCM number, not the header position) | any gpioreg alias (required)
//	direction   in | out (default: out for kind do, in for kind read)
//	active_low  true when the device is on at a low level (most relay boards, contacts to ground);
//	            applied to reads, writes, initial and edges alike (default false)
//	pull        up | down | none | float (none and float both disable the resistor);
//	            inputs only; omitted: leave the board's setting
//	initial     low | high (also off | on): the logical level an output is driven to when the
//	            daemon opens it (default low, i.e. inactive: a restart switches actuators off)
//	edge_count  {edge: rising | falling | both (default rising), debounce_ms: 0..10000 (default 0)}
//	            counts logical edges since the daemon started; edges closer than debounce_ms to
//	            the last counted edge are ignored (contact bounce)
//
// The PhysMCP address string works too: a bare first part is the pin, and
// any key above may follow as key=value, separated by ':'; edge= and
// debounce_ms= fill edge_count. mode=digital (the PhysMCP default) picks the
// direction from the capability's kind; mode=input, mode=output and
// mode=counter (edge_count with edge rising) are accepted as well.
//
//	address: "pin=14:mode=digital"
//	address: "GPIO17:direction=out:active_low=true"
//	address: "pin=22:edge=falling:debounce_ms=2:pull=up"
//
// A key may be given in the address string or as a binding key, not both.
//
// # Types
//
// Levels are data_type bool (true = active); edge counters are data_type
// int, kind read. Several capabilities may bind one pin (a do for the pump
// relay and a read of its state) if they agree on its electrical keys.
//
// # Read-back of outputs
//
// The node verifies every write by reading back. Where reading a pin that
// drives an output is safe (bcm283x with /dev/gpiomem, sysfs, fakes) the
// level is read from the pin. periph's gpioioctl backend (Raspberry Pi 5,
// or bcm283x without /dev/gpiomem) reconfigures an output line as an input
// with pull-up when it is read, which would switch a relay; there the
// driver returns the level it last drove instead.
package gpio
