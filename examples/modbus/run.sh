#!/usr/bin/env bash
# Starts modbus-sim (a boiler controller on 127.0.0.1:5020) and physd on
# this example's manifest and policy (MCP at http://127.0.0.1:8080/mcp),
# then, over HTTP: a viewer's do_ is refused (it names the role it needs),
# and the policy's demo operator token moves the circulation pump.
#   examples/modbus/run.sh                          # builds physd and modbus-sim first
#   PHYSD=/path/to/physd examples/modbus/run.sh     # uses that physd (modbus-sim is still built)
set -euo pipefail
# physd builds with go1.27.3 (go.mod); machines that pin GOTOOLCHAIN=local need it named.
export GOTOOLCHAIN=go1.27.3
cd "$(dirname "$0")/../.."
state=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$state"' EXIT
if [ -z "${PHYSD:-}" ]; then
  PHYSD=$state/physd
  go build -o "$PHYSD" ./cmd/physd
fi
go build -o "$state/modbus-sim" ./examples/modbus/modbus-sim
"$state/modbus-sim" 2>"$state/modbus-sim.log" &
pids+=($!)
"$PHYSD" run --manifest examples/modbus/physmcp.manifest.yml --policy examples/modbus/physmcp.policy.yml \
  --http 127.0.0.1:8080 --state "$state/physd" 2>"$state/physd.log" &
pids+=($!)
for _ in $(seq 100); do  # ready once the boiler answers (the bus check)
  curl -sf http://127.0.0.1:8080/readyz >/dev/null && break
  sleep 0.1
done
curl -sf http://127.0.0.1:8080/readyz >/dev/null || { echo "physd is not ready:"; cat "$state/physd.log"; exit 1; }
mcp() {  # mcp TOKEN METHOD NAME PARAMS
  curl -s http://127.0.0.1:8080/mcp -H "Authorization: Bearer $1" \
    -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
    -H 'MCP-Protocol-Version: 2026-07-28' -H "Mcp-Method: $2" ${3:+-H "Mcp-Name: $3"} \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$2\",\"params\":{${4:+$4,}\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\"io.modelcontextprotocol/clientCapabilities\":{}}}}"
}
show() { python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]["structuredContent"]; print({k: r[k] for k in ("status","permission","applied_value","previous_value","verified","reason") if r.get(k) is not None})'; }
echo "== do_pump_speed 80 as the wall display (viewer):"
mcp boilerroom-viewer-demo-token tools/call do_pump_speed '"name":"do_pump_speed","arguments":{"value":80,"idempotency_key":"modbus-demo-viewer"}' | show
echo "== do_pump_speed 80 as the operator console:"
mcp boilerroom-operator-demo-token tools/call do_pump_speed '"name":"do_pump_speed","arguments":{"value":80,"idempotency_key":"modbus-demo-1"}' | show
