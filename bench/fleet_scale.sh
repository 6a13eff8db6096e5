#!/usr/bin/env bash
# The fleet's scale run (issue #28): SITES sites × PER_SITE simulated
# gateways (in one process, each a physd node with its own NATS connection,
# uplink and serving side) publishing an observation every POLL_MS each, a
# hub of one nats-server and then of a three-server cluster (streams R3),
# and physd fleet connected to it; can_do and read_ through the fleet's
# MCP endpoint over HTTP during a measured window. See bench/fleetscale.
#
#   bench/fleet_scale.sh                         # 100 × 3, 10/s each, 1 then 3 servers (~4 min)
#   SERVERS=1 WINDOW=30s bench/fleet_scale.sh    # one hub layout, a shorter window
#
# Knobs (environment): SITES=100 PER_SITE=3 POLL_MS=100 SERVERS="1 3"
#   WARMUP=20s WINDOW=60s OUT=bench/fleet-results.md
# Needs: go, Linux (/proc for CPU and memory).
set -euo pipefail
# physd builds with go1.27.3 (go.mod); machines that pin GOTOOLCHAIN=local need it named.
export GOTOOLCHAIN=go1.27.3
cd "$(dirname "$0")/.."
SITES=${SITES:-100}
PER_SITE=${PER_SITE:-3}
POLL_MS=${POLL_MS:-100}
SERVERS=${SERVERS:-1 3}
WARMUP=${WARMUP:-20s}
WINDOW=${WINDOW:-60s}
OUT=${OUT:-bench/fleet-results.md}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/physd" ./cmd/physd
go build -o "$tmp/nats-server" github.com/nats-io/nats-server/v2
go build -o "$tmp/fleetscale" ./bench/fleetscale
{
	echo "# Fleet scale run"
	echo
	echo "\`SITES=$SITES PER_SITE=$PER_SITE POLL_MS=$POLL_MS SERVERS=\"$SERVERS\" WARMUP=$WARMUP WINDOW=$WINDOW bench/fleet_scale.sh\`"
	echo "on $(date -u +%Y-%m-%d), tree $(git describe --always --dirty 2>/dev/null || echo '?')."
	echo
	cat <<'NOTES'
The gateways run in the bench's process (each a physd node with its own
NATS connection, uplink and serving side: the code physd run uses; the
history and alarm copies off), on the same machine as the hub and physd
fleet, while other work ran on it (the load averages below). CPU is each
process's own CPU time (utime + stime from /proc) over the window, in %
of one core, the hub's summed over its servers; RSS is the peak of 1 s
samples. can_do goes through physd fleet's /mcp over HTTP with a bearer
token, one call at a time: four scoped to one random site (its gateways)
for each one across the whole fleet (so the fleet-wide p99 comes from
few calls: n in the table). The observation delay runs from the gateway's device
read (the observation's timestamp) to its arrival at a NATS subscriber
in the bench's process, and to its arrival at physd fleet, derived from
read_ answers of random gateways (answer time − timestamp − age_ms: an
upper bound, the answer's way back over HTTP is in it). Not measured: a
real WAN, gateways on machines of their own. The figures are explained in
the doc comment of bench/fleetscale/main.go.

NOTES
} >"$tmp/report.md"
for n in $SERVERS; do
	echo "== hub of $n server(s)" >&2
	"$tmp/fleetscale" -physd "$tmp/physd" -nats-server "$tmp/nats-server" -sites "$SITES" -per-site "$PER_SITE" -poll-ms "$POLL_MS" \
		-servers "$n" -warmup "$WARMUP" -window "$WINDOW" -json "$tmp/servers-$n.json" >"$tmp/servers-$n.md"
	{
		echo "## Hub of $n nats-server process(es)"
		echo
		cat "$tmp/servers-$n.md"
		echo
	} >>"$tmp/report.md"
done
cp "$tmp/report.md" "$OUT"
cat "$OUT"
