package main

import (
	"github.com/physd/physd/alarms"
	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mqtt"
)

// reloadHooks are the components built from the manifest at start that
// follow a reload once the new manifest is in force (reloader.hooks), in
// this order: the alarm engine (alarms of removed or changed definitions
// are cleared, and their events audited, before MQTT forgets removed
// tools), the history (which capabilities are recorded) and the MQTT
// publisher (discovery configs and retained topics). Each is quick and
// cannot fail the reload. The bus and alarm gauges need no hook: they
// list the buses and alarms in force at each scrape (registerBusMetrics,
// startAlarms). Nil components (history or MQTT off) are left out.
func reloadHooks(e *alarms.Engine, h *history.History, p *mqtt.Publisher) []func(*manifest.Manifest) {
	var hooks []func(*manifest.Manifest)
	if e != nil {
		hooks = append(hooks, e.Reload)
	}
	if h != nil {
		hooks = append(hooks, h.Reload)
	}
	if p != nil {
		hooks = append(hooks, p.Reload)
	}
	return hooks
}
