package main

import (
	"fmt"
	"strings"
)

// results are one scale run's figures.
type results struct {
	Sites, PerSite, Gateways, PollMS, HubServers int
	WindowS                                      float64
	Machine, LoadBefore, LoadAfter               string

	ObsSentPerS, ObsReceivedPerS float64
	ObsDroppedAtGateways         uint64

	HubCPUPercent, FleetCPUPercent, GatewaysCPUPercent float64
	HubRSSMiB, FleetRSSMiB, GatewaysRSSMiB             float64

	CanDoSite, CanDoFleet                 dist
	CanDoSiteGateways, CanDoFleetGateways int
	CanDoIncomplete, CanDoErrors          int
	CanDoFirstError                       string `json:",omitempty"`

	ObsDelayNATS, ObsDelayFleet, ReadAge dist
	ReadNotCached, ReadErrors            int
	ReadFirstError                       string `json:",omitempty"`
}

func (r *results) markdown() string {
	var b strings.Builder
	hub := "1 nats-server process, streams R1"
	if r.HubServers == 3 {
		hub = "3 nats-server processes in a cluster, streams R3"
	}
	fmt.Fprintf(&b, "%d sites × %d gateways = %d gateways, each polling every %d ms; hub: %s; measured over %.0f s\n\n", r.Sites, r.PerSite, r.Gateways, r.PollMS, hub, r.WindowS)
	fmt.Fprintf(&b, "Machine: %s; load average before %s, after %s\n\n", r.Machine, r.LoadBefore, r.LoadAfter)
	row := func(what, value string) { fmt.Fprintf(&b, "| %s | %s |\n", what, value) }
	d := func(x dist) string {
		if x.N == 0 {
			return "none"
		}
		return fmt.Sprintf("p50 %.1f ms, p99 %.1f ms, max %.1f ms (n = %d)", x.P50, x.P99, x.Max, x.N)
	}
	b.WriteString("| what | measured |\n| --- | --- |\n")
	row("observations sent by the gateways", fmt.Sprintf("%.0f/s (%d not sent: not connected)", r.ObsSentPerS, r.ObsDroppedAtGateways))
	row("observations received by a NATS subscriber", fmt.Sprintf("%.0f/s", r.ObsReceivedPerS))
	row("hub CPU (% of one core) and peak RSS", fmt.Sprintf("%.1f %%, %.0f MiB", r.HubCPUPercent, r.HubRSSMiB))
	row("physd fleet CPU and peak RSS", fmt.Sprintf("%.1f %%, %.0f MiB", r.FleetCPUPercent, r.FleetRSSMiB))
	row("the gateways' process CPU and peak RSS", fmt.Sprintf("%.1f %%, %.0f MiB", r.GatewaysCPUPercent, r.GatewaysRSSMiB))
	row(fmt.Sprintf("can_do scoped to one site (%d gateways)", r.CanDoSiteGateways), d(r.CanDoSite))
	row(fmt.Sprintf("can_do across the fleet (%d gateways)", r.CanDoFleetGateways), d(r.CanDoFleet))
	row("can_do incomplete (a gateway unanswered) / errors", fmt.Sprintf("%d / %d %s", r.CanDoIncomplete, r.CanDoErrors, r.CanDoFirstError))
	row("observation delay, device read → NATS subscriber", d(r.ObsDelayNATS))
	row("observation delay, device read → physd fleet (read_: answer time − timestamp − age_ms)", d(r.ObsDelayFleet))
	row("read_ at the fleet: age_ms of the latest observation", d(r.ReadAge))
	row("read_ not from the fleet's copy / errors", fmt.Sprintf("%d / %d %s", r.ReadNotCached, r.ReadErrors, r.ReadFirstError))
	return b.String()
}
