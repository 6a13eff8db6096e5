#!/usr/bin/env bash
# Three simulated greenhouse sites of the fleet (physd run ×3: north on
# 127.0.0.1:8091, south on :8092, east on :8093), each connecting to the
# fleet's NATS hub on 127.0.0.1:4222 (physd fleet --config
# examples/fleet/fleet.yml embeds it). Runs until Ctrl-C.
#   examples/fleet/sites.sh                        # builds physd first
#   PHYSD=/path/to/physd examples/fleet/sites.sh   # uses that physd
set -euo pipefail
# physd builds with go1.27.3 (go.mod); machines that pin GOTOOLCHAIN=local need it named.
export GOTOOLCHAIN=go1.27.3
root=$(cd "$(dirname "$0")/../.." && pwd)
state=${STATE:-$(mktemp -d)}
mkdir -p "$state"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; [ -n "${STATE:-}" ] || rm -rf "$state"' EXIT
trap 'exit 0' INT TERM
if [ -z "${PHYSD:-}" ]; then
  PHYSD=$state/physd
  (cd "$root" && go build -o "$PHYSD" ./cmd/physd)
fi
cd "$root/examples/fleet"   # the manifests' password_file paths are relative to here
port=8091
for site in north south east; do
  "$PHYSD" run --manifest "$site.manifest.yml" --policy ../greenhouse/physmcp.policy.yml --http "127.0.0.1:$port" --state "$state/$site" 2>"$state/$site.log" &
  pids+=($!)
  port=$((port + 1))
done
for site in north south east; do
  until grep -q '"msg":"ready"' "$state/$site.log" 2>/dev/null; do sleep 0.1; done
done
echo "sites north, south and east serve on 127.0.0.1:8091-8093 (logs in $state); Ctrl-C stops them"
wait
