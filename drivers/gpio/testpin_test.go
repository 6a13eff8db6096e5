package gpio

import "periph.io/x/conn/v3/gpio/gpiotest"

// testPin is periph's own fake GPIO pin (gpiotest.Pin).
type testPin = gpiotest.Pin
