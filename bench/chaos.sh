#!/usr/bin/env bash
# bench/chaos.sh: the fail-safe chaos report. Runs every trigger of the
# fail-safe plant (SIGTERM, SIGKILL and restart, lease end, a device that
# refuses writes and recovers, a bus that comes back, quorum loss, an
# interlock, a permissive, a remote interlock's owner killed, the Modbus
# host watchdog after SIGKILL, the systemd watchdog) for N rounds each,
# with the race detector as the README's test command runs it, and prints
# each trigger's p50/p99/max time to the safe value at the device.
#
#   bench/chaos.sh            # 20 rounds
#   ROUNDS=5 bench/chaos.sh
#
# Run it on a quiet machine: the figures are wall-clock times of real
# processes; a busy machine stretches them.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
rounds=${ROUNDS:-20}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# -parallel 1: one trigger at a time, so no round is stretched by another.
PHYSD_CHAOS_ROUNDS=$rounds go test -race -count=1 -parallel 1 -timeout 60m \
	-run 'TestFailSafe|TestHeartbeatKillToSafe|TestWatchdogSupervisor' -v ./e2e >"$log" 2>&1 || {
	grep -E -- '--- FAIL|_test.go' "$log" | head -40
	echo "bench/chaos.sh: a chaos round failed (log above)" >&2
	exit 1
}
echo "fail-safe chaos, $rounds rounds per trigger ($(go env GOOS)/$(go env GOARCH), $(nproc) cores, race detector):"
grep -E 'over [0-9]+ rounds|REPORT host watchdog|watchdog .* rounds: freeze' "$log" | sed -E 's/^ *[a-z_]+_test\.go:[0-9]+: /  /'
