#!/usr/bin/env bash
# A fleet on one machine: the fleet endpoint (physd fleet, with its NATS hub
# embedded) and three simulated greenhouse sites (sites.sh: physd run ×3,
# one gateway each, all named gw_greenhouse_001: the fleet tells them apart
# by site).
# Then it shows what one agent sees across the sites: the tools, a value
# with its age, a can_do across the sites, and a do_ forwarded to a site.
#   examples/fleet/run.sh                        # builds physd first
#   PHYSD=/path/to/physd examples/fleet/run.sh   # uses that physd
#   KEEP=1 examples/fleet/run.sh                 # keeps the fleet running (Ctrl-C ends it)
set -euo pipefail
# physd builds with go1.27.3 (go.mod); machines that pin GOTOOLCHAIN=local need it named.
export GOTOOLCHAIN=go1.27.3
root=$(cd "$(dirname "$0")/../.." && pwd)
state=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$state"' EXIT
if [ -z "${PHYSD:-}" ]; then
  PHYSD=$state/physd
  (cd "$root" && go build -o "$PHYSD" ./cmd/physd)
fi
cd "$root/examples/fleet"   # the manifests' password_file paths are relative to here
"$PHYSD" fleet --config fleet.yml --policy fleet.policy.yml --http 127.0.0.1:8090 --state "$state/fleet" 2>"$state/fleet.log" &
pids+=($!)
until grep -q '"msg":"ready"' "$state/fleet.log" 2>/dev/null; do sleep 0.1; done
STATE=$state/sites PHYSD=$PHYSD "$root/examples/fleet/sites.sh" >"$state/sites.out" &
pids+=($!)
until grep -q 'Ctrl-C stops them' "$state/sites.out" 2>/dev/null; do sleep 0.1; done
sleep 1  # the catalogs reach the fleet endpoint
mcp() {  # mcp TOKEN METHOD NAME PARAMS
  curl -s "http://127.0.0.1:8090/mcp" -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
    -H "Authorization: Bearer $1" -H 'MCP-Protocol-Version: 2026-07-28' -H "Mcp-Method: $2" ${3:+-H "Mcp-Name: $3"} \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$2\",\"params\":{${4:+$4,}\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\"io.modelcontextprotocol/clientCapabilities\":{}}}}"
}
op=greenhouse-operator-demo-token
echo "== the fleet's tools (one per capability family, with site and zone arguments):"
mcp $op tools/list | python3 -c 'import json,sys; print([t["name"] for t in json.load(sys.stdin)["result"]["tools"]])'
echo "== read_temperature of zone_a at site south (the latest observation, with its age; max_age_ms reads through the site):"
mcp $op tools/call read_temperature '"name":"read_temperature","arguments":{"site":"south","zone":"zone_a","max_age_ms":0}' |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]["structuredContent"]; print({k: r.get(k) for k in ("value","unit","quality","site","source","age_ms")})'
echo "== can_do: heat zone_c, asked of every site at once:"
mcp $op tools/call can_do '"name":"can_do","arguments":{"intent":{"semantic_tags":["heating"],"action":"set","location":"zone_c","value":30}}' |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]["structuredContent"]; print(json.dumps({"candidates": [(c["capability"], c.get("site"), c["source"], c["permission"]) for c in r["candidates"]], "blocked": [(b["capability"], b.get("site"), b.get("code")) for b in r["blocked"]], "consulted": r["metadata"]["peers_consulted"], "answered": r["metadata"]["responses_received"]}, indent=1))'
echo "== do_heater zone_c at site north, forwarded to its gateway (which authenticates the token itself):"
mcp $op tools/call do_heater '"name":"do_heater","arguments":{"site":"north","zone":"zone_c","value":30,"idempotency_key":"fleet-demo-1"}' |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]["structuredContent"]; print({k: r.get(k) for k in ("status","source","applied_value","previous_value","verified")})'
echo "== the same call with a token only the fleet knows: the site refuses it:"
mcp fleet-only-demo-token tools/call do_heater '"name":"do_heater","arguments":{"site":"north","zone":"zone_c","value":35,"idempotency_key":"fleet-demo-2"}' |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]["structuredContent"]; print({k: r.get(k) for k in ("status","permission","code")})'
echo "== the gateways as the fleet sees them:"
curl -s -H "Authorization: Bearer $op" http://127.0.0.1:8090/status | python3 -c 'import json,sys; f=json.load(sys.stdin)["fleet"]; print(f["sites"], [(m["site"], m["name"], m["state"], m["serves"]) for m in f["members"]])'
if [ -n "${KEEP:-}" ]; then
  echo "== the fleet runs: MCP at http://127.0.0.1:8090/mcp (Bearer $op); Ctrl-C ends it"
  wait
fi
