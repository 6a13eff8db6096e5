#!/usr/bin/env bash
# physd at the scale of a plant: 10 000 points polled every second from 20
# Modbus TCP devices (modbus-sim -points 500), or with SITE=opcua monitored
# on one OPC UA server (node-opcua), history on, MQTT when
# mosquitto is installed. Reports physd's CPU (share of one core), RSS, the
# age of the observations an agent reads, history.db growth and do_
# latency under that load, and appends the report to bench/scale-results.md
# (the Go program bench/scale10k measures; see its comment for the phases).
#
#   bench/scale10k.sh                         # ~5 minutes
#   LABEL="after: …" bench/scale10k.sh        # the report's heading
#   BEFORE_REF=3f2fb9c bench/scale10k.sh      # measure physd as built from that commit,
#                                             # with this tree's harness and site
#   SITE=opcua bench/scale10k.sh              # the same on one node-opcua server of 10 000
#                                             # points, every one a monitored item (needs
#                                             # cd examples/opcua/server && npm ci)
#   SITE=opcua OPCUA_SLICES=10 bench/scale10k.sh  # the server sets a tenth of its points
#                                             # every 100 ms, not all at once each second
#
# Knobs (environment): SITE=modbus (or opcua) DEVICES=20 POINTS=500 POLL_MS=1000 SETTLE=60s
# MEASURE=120s DO=60s DO_EVERY=200ms MQTT=auto (auto: mosquitto if installed; off: none)
# OUT=bench/scale-results.md LABEL=run PROFILE= (a directory: build physd
# with -tags pprof and save CPU, heap and allocs profiles of the running
# daemon there) PHYSD_ENV= (extra environment for physd, e.g. "GOGC=200")
# PHYSD_ARGS= (extra physd run flags, e.g. "--history-max-mb 0") KEEP= (1: keep the
# work directory: the manifests, physd's and the devices' logs, the state).
set -euo pipefail
export GOTOOLCHAIN=go1.27.3
cd "$(dirname "$0")/.."
BIN=$(mktemp -d /tmp/physd-scale-bin.XXXXXX)
trap 'rm -rf "$BIN"' EXIT
tags=()
[[ -n "${PROFILE:-}" ]] && tags=(-tags pprof)
if [[ -n "${BEFORE_REF:-}" ]]; then
	# The same harness and site, physd from another commit (its tree
	# unpacked apart, so the repository's worktrees stay as they are).
	git archive "$BEFORE_REF" | tar -x -C "$BIN" --one-top-level=before
	(cd "$BIN/before" && go build -trimpath "${tags[@]}" -o "$BIN/physd" ./cmd/physd)
else
	go build -trimpath "${tags[@]}" -o "$BIN/physd" ./cmd/physd
fi
go build -trimpath -o "$BIN/scale10k" ./bench/scale10k
site=${SITE:-modbus}
devices=()
if [[ "$site" == opcua ]]; then
	# The Node that npm ci brought (drivers/opcua/opcuatest finds it the same way).
	server=$PWD/examples/opcua/server
	if [[ ! -x "$server/node_modules/.bin/node" || ! -d "$server/node_modules/node-opcua" ]]; then
		echo "SITE=opcua: node-opcua is not installed (run: cd examples/opcua/server && npm ci)" >&2
		exit 1
	fi
	devices=(-site opcua -node "$server/node_modules/.bin/node" -opcua-server "$server" -opcua-slices "${OPCUA_SLICES:-1}")
else
	go build -trimpath -o "$BIN/modbus-sim" ./examples/modbus/modbus-sim
	devices=(-sim "$BIN/modbus-sim")
fi
mqtt=${MQTT:-auto}
if [[ "$mqtt" == auto ]] && ! command -v mosquitto >/dev/null; then
	echo "mosquitto not installed: measuring without MQTT" >&2
	mqtt=off
fi
[[ "$mqtt" == off ]] && mqtt=""
"$BIN/scale10k" -physd "$BIN/physd" "${devices[@]}" \
	-devices "${DEVICES:-20}" -points "${POINTS:-500}" -poll-ms "${POLL_MS:-1000}" \
	-settle "${SETTLE:-60s}" -measure "${MEASURE:-120s}" -do "${DO:-60s}" -do-every "${DO_EVERY:-200ms}" \
	-mqtt "$mqtt" -label "${LABEL:-run}" -out "${OUT:-bench/scale-results.md}" \
	${KEEP:+-keep} ${PROFILE:+-profile "$PROFILE"} ${PHYSD_ENV:+-physd-env "$PHYSD_ENV"} ${PHYSD_ARGS:+-physd-args "$PHYSD_ARGS"}
