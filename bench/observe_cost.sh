#!/usr/bin/env bash
# The observation stream's cost: physd serving bench/manifest50.yml with
# every one of its 50 capabilities polled every second (poll_ms: 1000,
# history and the MCP resource loop consuming the stream), against the same
# manifest without polling. Measures the process's CPU time per second of
# wall time (utime+stime from /proc, so other load on the machine does not
# count) and its RSS after the run.
# Usage: bench/observe_cost.sh [seconds]   (default 30)
set -euo pipefail
secs=${1:-30}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/physd" ./cmd/physd
sed 's/^    semantic_tags: \(.*\)$/    semantic_tags: \1\n    poll_ms: 1000\n    deadband: 0.1/' bench/manifest50.yml > "$tmp/polled.yml"
[ "$(grep -c 'poll_ms: 1000' "$tmp/polled.yml")" = 50 ] || { echo "expected 50 polled capabilities" >&2; exit 1; }
tck=$(getconf CLK_TCK)
measure() { # name manifest
  local state="$tmp/state-$1"
  "$tmp/physd" run --manifest "$2" --state "$state" --http 127.0.0.1:0 --log-level warn 2>"$tmp/$1.log" &
  local pid=$!
  sleep 5 # start-up and the first polls
  local a; a=$(awk '{print $14+$15}' "/proc/$pid/stat")
  sleep "$secs"
  local b; b=$(awk '{print $14+$15}' "/proc/$pid/stat")
  local rss; rss=$(awk '/VmRSS/{print $2}' "/proc/$pid/status")
  kill -INT "$pid"; wait "$pid" || true
  local hist; hist=$(stat -c %s "$state/history.db" 2>/dev/null || echo 0)
  awk -v n="$1" -v a="$a" -v b="$b" -v t="$tck" -v s="$secs" -v r="$rss" -v h="$hist" \
    'BEGIN{printf "%-22s cpu %.1f ms/s  rss %.1f MiB  history.db %d bytes\n", n, (b-a)*1000/t/s, r/1024, h}'
}
measure "50 caps, no polling" bench/manifest50.yml
measure "50 caps polled at 1 s" "$tmp/polled.yml"
