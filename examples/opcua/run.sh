#!/usr/bin/env bash
# Installs the node-opcua test server (npm ci in examples/opcua/server, once:
# Node 22 and node-opcua 2.186.4 from package-lock.json), starts it on
# 127.0.0.1:4840 and physd on this example's manifest (MCP at
# http://127.0.0.1:8080/mcp), then, over HTTP: reads the tank temperature,
# moves the setpoint to 65 (verified by read-back), is refused 110 (inside
# the capability's range, outside the node's EURange 0..100: nothing is
# sent) and reads the failed level sensor (BadSensorFailure).
#   examples/opcua/run.sh                          # builds physd first
#   PHYSD=/path/to/physd examples/opcua/run.sh     # uses that physd
set -euo pipefail
# physd builds with go1.27.3 (go.mod); machines that pin GOTOOLCHAIN=local need it named.
export GOTOOLCHAIN=go1.27.3
cd "$(dirname "$0")/../.."
state=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$state"' EXIT
server=examples/opcua/server
if [ ! -x "$server/node_modules/.bin/node" ] || [ ! -d "$server/node_modules/node-opcua" ]; then
  echo "== npm ci in $server (Node 22, node-opcua 2.186.4)"
  (cd "$server" && npm ci --no-audit --no-fund >/dev/null)
fi
if [ -z "${PHYSD:-}" ]; then
  PHYSD=$state/physd
  go build -o "$PHYSD" ./cmd/physd
fi
(cd "$server" && exec node_modules/.bin/node server.js --port 4840 --pki "$state/pki") >"$state/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  grep -q '^ready ' "$state/server.log" && break
  sleep 0.1
done
grep -q '^ready ' "$state/server.log" || { echo "the OPC UA server did not start:"; cat "$state/server.log"; exit 1; }
"$PHYSD" run --manifest examples/opcua/physmcp.manifest.yml --http 127.0.0.1:8080 --state "$state/physd" 2>"$state/physd.log" &
pids+=($!)
for _ in $(seq 100); do  # ready once the session is open (the bus check)
  curl -sf http://127.0.0.1:8080/readyz >/dev/null && break
  sleep 0.1
done
curl -sf http://127.0.0.1:8080/readyz >/dev/null || { echo "physd is not ready:"; cat "$state/physd.log"; exit 1; }
mcp() {  # mcp METHOD NAME PARAMS
  curl -s http://127.0.0.1:8080/mcp \
    -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
    -H 'MCP-Protocol-Version: 2026-07-28' -H "Mcp-Method: $1" ${2:+-H "Mcp-Name: $2"} \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$1\",\"params\":{${3:+$3,}\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\"io.modelcontextprotocol/clientCapabilities\":{}}}}"
}
show() { python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]["structuredContent"]; print({k: r[k] for k in ("value","quality","unit","status","code","applied_value","previous_value","verified","reason") if r.get(k) is not None})'; }
echo "== read_tank_temperature:"
mcp tools/call read_tank_temperature '"name":"read_tank_temperature","arguments":{}' | show
echo "== do_tank_setpoint 65:"
mcp tools/call do_tank_setpoint '"name":"do_tank_setpoint","arguments":{"value":65,"idempotency_key":"opcua-demo-1"}' | show
echo "== do_tank_setpoint 110 (outside the EURange 0..100 the server publishes):"
mcp tools/call do_tank_setpoint '"name":"do_tank_setpoint","arguments":{"value":110,"idempotency_key":"opcua-demo-2"}' | show
echo "== read_level_sensor (the server reports BadSensorFailure):"
mcp tools/call read_level_sensor '"name":"read_level_sensor","arguments":{}' | show
