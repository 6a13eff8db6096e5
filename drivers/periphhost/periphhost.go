// Package periphhost runs periph.io's host.Init once per process for the
// drivers that share it (i2c, gpio) and keeps its report, so a driver can
// quote why its bus or pins are missing.
package periphhost

import (
	"slices"
	"strings"
	"sync"

	"periph.io/x/conn/v3/driver/driverreg"
	"periph.io/x/host/v3"
)

var (
	once  sync.Once
	state *driverreg.State
	err   error
)

// Notes initialises the host drivers (once) and returns the skip or failure
// reasons of the periph drivers whose names contain any of the words, joined
// for an error message. On a box without the hardware, host.Init succeeds
// with those drivers skipped; it fails only on driver-graph bugs.
func Notes(words ...string) string {
	once.Do(func() { state, err = host.Init() })
	if err != nil {
		return "periph host.Init: " + err.Error()
	}
	var notes []string
	for _, f := range slices.Concat(state.Failed, state.Skipped) {
		name := f.D.String()
		for _, w := range words {
			if strings.Contains(name, w) {
				notes = append(notes, f.String())
				break
			}
		}
	}
	return strings.Join(notes, "; ")
}
