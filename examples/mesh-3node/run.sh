#!/usr/bin/env bash
# Starts three physd gateways on 127.0.0.2-4 that form one mesh, then shows
# a can_do answered across them (each owner applies its own policy), a do_
# routed to its owner, and the mesh as one gateway sees it.
#   examples/mesh-3node/run.sh                        # builds physd first
#   PHYSD=/path/to/physd examples/mesh-3node/run.sh   # uses that physd
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
for n in a b c; do
  ip=$(grep -m1 'bind:' examples/mesh-3node/node_$n.yml | awk '{print $2}')
  "$PHYSD" run --manifest examples/mesh-3node/node_$n.yml --http "$ip:8080" --state "$state/$n" 2>"$state/$n.log" &
  pids+=($!)
done
sleep 3
mcp() {  # mcp HOST METHOD NAME PARAMS
  curl -s "http://$1:8080/mcp" -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
    -H 'MCP-Protocol-Version: 2026-07-28' -H "Mcp-Method: $2" ${3:+-H "Mcp-Name: $3"} \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$2\",\"params\":{${4:+$4,}\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\"io.modelcontextprotocol/clientCapabilities\":{}}}}"
}
echo "== can_do for ventilation, asked of gateway A (which has no fan or vent):"
mcp 127.0.0.2 tools/call can_do '"name":"can_do","arguments":{"intent":{"semantic_tags":["ventilation"],"action":"set","value":40}}' |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]["structuredContent"]; print(json.dumps({k: r[k] for k in ("feasible",)} | {"candidates": [(c["capability"], c["source"], c["confidence"], c["permission"]) for c in r["candidates"]], "metadata": r["metadata"]}, indent=1))'
echo "== do_fan_zone_b asked of gateway A, routed to its owner gateway B:"
mcp 127.0.0.2 tools/call do_fan_zone_b '"name":"do_fan_zone_b","arguments":{"value":40,"idempotency_key":"mesh-demo-1","source":"gw_zone_b"}' |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]["structuredContent"]; print({k: r[k] for k in ("status","source","applied_value","previous_value","verified")})'
echo "== mesh status from gateway C:"
curl -s http://127.0.0.4:8080/status | python3 -c 'import json,sys; m=json.load(sys.stdin)["mesh"]; print(m["partition_state"], "alive", m["alive"], [(x["name"], x["state"]) for x in m["members"]])'
