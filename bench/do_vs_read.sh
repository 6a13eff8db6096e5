#!/usr/bin/env bash
# The do_ path's cost beside a cached read_, in one run of one daemon:
#   - server CPU per call (user+system of the physd process, /proc) for
#     read_temperature_zone_a (cache hits) and do_fan_zone_b (fresh keys:
#     ledger, device read-write-read-back, audit), both at c=8, alternating;
#   - syncs per do_: strace -f -c on the daemon while N do_ calls run one
#     after another (fsync, fdatasync, sync_file_range, msync).
#
#   bench/do_vs_read.sh                # ~40 s
#   ROUNDS=5 SECS=4 SYNC_CALLS=200 bench/do_vs_read.sh
#
# Needs: go, strace (Debian's strace), awk.
set -euo pipefail
# physd builds with go1.27.3 (go.mod); machines that pin GOTOOLCHAIN=local need it named.
export GOTOOLCHAIN=go1.27.3
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-3}
CONC=${CONC:-8}
SYNC_CALLS=${SYNC_CALLS:-100}

WORK=$(mktemp -d /tmp/physd-dovsread.XXXXXX)
PID=""
cleanup() {
	[[ -n "$PID" ]] && kill "$PID" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

go build -trimpath -o "$WORK/physd" ./cmd/physd
go build -trimpath -o "$WORK/loadgen" ./bench/loadgen
"$WORK/physd" run --manifest examples/greenhouse/physmcp.manifest.yml --state "$WORK/state" \
	--http 127.0.0.1:0 2>"$WORK/physd.log" >/dev/null &
PID=$!
for _ in $(seq 400); do
	ADDR=$(sed -n 's/.*"msg":"listening".*"addr":"\([^"]*\)".*/\1/p' "$WORK/physd.log" | head -1)
	[[ -n "$ADDR" ]] && break
	sleep 0.05
done
[[ -n "$ADDR" ]] || { cat "$WORK/physd.log" >&2; exit 1; }
URL="http://$ADDR/mcp"
"$WORK/loadgen" -url "$URL" -kind do -n 20 -warmup 0 >/dev/null

# ticks USER SYS: the daemon's user and system CPU in clock ticks.
ticks() { awk '{ print $14, $15 }' "/proc/$PID/stat"; }
HZ=$(getconf CLK_TCK)

echo "== CPU per call, c=$CONC, $ROUNDS rounds of ${SECS} s each (read_ cache hits, then do_)"
: >"$WORK/cpu.jsonl"
: >"$WORK/split.txt"
for r in $(seq "$ROUNDS"); do
	for kind in read do; do
		read -r u0 s0 < <(ticks)
		"$WORK/loadgen" -url "$URL" -pid "$PID" -kind "$kind" -c "$CONC" -d "${SECS}s" -json -tag kind="$kind" >>"$WORK/cpu.jsonl"
		read -r u1 s1 < <(ticks)
		calls=$(tail -1 "$WORK/cpu.jsonl" | sed -n 's/.*"calls":\([0-9]*\).*/\1/p')
		echo "$kind $((u1 - u0)) $((s1 - s0)) $calls" >>"$WORK/split.txt"
	done
done
awk -v hz="$HZ" '{ u[$1] += $2; s[$1] += $3; c[$1] += $4 }
	END { for (k in u) printf "%-5s user %.0f µs/call, system %.0f µs/call (the kernel: syscalls, fsync)\n", k, u[k] * 1e6 / hz / c[k], s[k] * 1e6 / hz / c[k] }' "$WORK/split.txt"
awk '
	{
		kind = ""; cpu = 0; calls = 0; p50 = 0
		if (match($0, /"kind":"[a-z]+"/)) kind = substr($0, RSTART + 8, RLENGTH - 9)
		if (match($0, /"srv_cpu_us_per_call":[0-9.]+/)) cpu = substr($0, RSTART + 22, RLENGTH - 22)
		if (match($0, /"calls":[0-9]+/)) calls = substr($0, RSTART + 8, RLENGTH - 8)
		if (match($0, /"p50_us":[0-9.]+/)) p50 = substr($0, RSTART + 9, RLENGTH - 9)
		n[kind]++; sum[kind] += cpu; c[kind] += calls
		list[kind] = list[kind] sprintf(" %.0f", cpu); lat[kind] = lat[kind] sprintf(" %.0f", p50)
	}
	END {
		for (k in n) printf "%-5s server CPU-µs/call per round:%s (mean %.0f); p50 µs:%s; %d calls\n", k, list[k], sum[k] / n[k], lat[k], c[k]
		if (n["read"] && n["do"]) printf "do_/read_ CPU ratio: %.2f\n", (sum["do"] / n["do"]) / (sum["read"] / n["read"])
	}' "$WORK/cpu.jsonl"

echo "== syncs per do_ ($SYNC_CALLS sequential do_ calls under strace -f -c)"
strace -f -c -e trace=fsync,fdatasync,sync_file_range,msync -p "$PID" -o "$WORK/strace.txt" &
SPID=$!
sleep 1
"$WORK/loadgen" -url "$URL" -kind do -c 1 -n "$SYNC_CALLS" -warmup 0 >/dev/null
sleep 0.5
kill -INT "$SPID"
wait "$SPID" 2>/dev/null || true
cat "$WORK/strace.txt"
awk -v n="$SYNC_CALLS" '$NF ~ /^(fsync|fdatasync|sync_file_range|msync)$/ { s += $4; printf "%s: %d (%.2f per do_)\n", $NF, $4, $4 / n } END { printf "all syncs: %d for %d do_ calls = %.2f per do_\n", s, n, s / n }' "$WORK/strace.txt"
