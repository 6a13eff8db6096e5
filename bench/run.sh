#!/usr/bin/env bash
# physd benchmarks against a bare go-sdk server, over loopback HTTP.
#
#   bench/run.sh                      # ~4 minutes; prints the table, writes bench/results.md
#   PAIRS=8 PIN=1 bench/run.sh        # knobs below
#
# Knobs (environment):
#   SRV_PROCS=2   GOMAXPROCS of every server (physd, bare typed, bare raw)
#   PIN=0         1: pin the servers to CPU $SRV_CPUS and loadgen to $GEN_CPUS with taskset
#   PAIRS=6       read_ A/B pairs (order alternates: physd,bare,raw / raw,bare,physd)
#   TPUT_S=3 LAT_S=2 DO_S=3 CANDO_S=3 ROUNDS=4 STARTS=12
#   STATE_ROOT    parent of the physd state directories (default: a mktemp dir under /tmp)
#   PHYSD_ENV     extra environment for physd only, e.g. PHYSD_ENV="GOGC=400" (default none)
#   OUT=bench/results   the report goes to $OUT.md, the raw measurements to $OUT.raw.jsonl
#   BEFORE_REF=   a git ref: physd built from it runs beside this tree's in every
#                 read_, do_ and can_do round (server "before"), and the report
#                 gets a before/after table (e.g. BEFORE_REF=37b8930)
#
# Needs: go, coreutils, awk, sed; taskset only with PIN=1 (loadgen parses and reports).
set -euo pipefail
# physd builds with go1.27.3 (go.mod); machines that pin GOTOOLCHAIN=local need it named.
export GOTOOLCHAIN=go1.27.3
cd "$(dirname "$0")/.."
ROOT=$(pwd)
CMDLINE="$(printf '%q ' "$0" "$@")"
ENVLINE=""
for v in SRV_PROCS PIN PAIRS TPUT_S LAT_S DO_S CANDO_S ROUNDS STARTS STATE_ROOT PHYSD_ENV OUT BEFORE_REF; do
	[[ -n "${!v:-}" ]] && ENVLINE+="$v=${!v} "
done
SRV_PROCS=${SRV_PROCS:-2}
PIN=${PIN:-0}
SRV_CPUS=${SRV_CPUS:-1}
GEN_CPUS=${GEN_CPUS:-0}
PAIRS=${PAIRS:-6}
TPUT_S=${TPUT_S:-3}
LAT_S=${LAT_S:-2}
DO_S=${DO_S:-3}
CANDO_S=${CANDO_S:-3}
ROUNDS=${ROUNDS:-4}
STARTS=${STARTS:-12}
PHYSD_ENV=${PHYSD_ENV:-}
OUT=${OUT:-bench/results}
BEFORE_REF=${BEFORE_REF:-}
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

WORK=$(mktemp -d /tmp/physd-bench.XXXXXX)
STATE_ROOT=${STATE_ROOT:-$WORK/state}
mkdir -p "$STATE_ROOT"
RAW=$WORK/raw.jsonl
: >"$RAW"
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK/state" "$WORK"/*.bin
	[[ -d "$WORK/before" ]] && git worktree remove --force "$WORK/before" 2>/dev/null || true
}
trap cleanup EXIT

SRV_PIN=() GEN_PIN=()
if [[ "$PIN" == 1 ]]; then
	SRV_PIN=(taskset -c "$SRV_CPUS")
	GEN_PIN=(taskset -c "$GEN_CPUS")
fi

echo "== build (go build -trimpath, identical flags for physd and baresdk)" >&2
BUILD=(go build -trimpath)
"${BUILD[@]}" -o "$WORK/physd.bin" ./cmd/physd
"${BUILD[@]}" -o "$WORK/baresdk.bin" ./bench/baresdk
"${BUILD[@]}" -o "$WORK/loadgen.bin" ./bench/loadgen
PHYSD=$WORK/physd.bin BARE=$WORK/baresdk.bin LG=$WORK/loadgen.bin
if [[ -n "$BEFORE_REF" ]]; then
	git worktree add --detach -q "$WORK/before" "$BEFORE_REF"
	(cd "$WORK/before" && "${BUILD[@]}" -o "$WORK/before.bin" ./cmd/physd)
fi
BEFORE=$WORK/before.bin
"$PHYSD" validate bench/manifest50.yml >&2

# start NAME ARGS... : starts a server with GOMAXPROCS=$SRV_PROCS, sets
# $PID and $ADDR from its {"msg":"listening","addr":...} log line.
start() {
	local name=$1
	shift
	local log=$WORK/$name.log
	local extra=()
	[[ "$name" == physd* && -n "$PHYSD_ENV" ]] && read -ra extra <<<"$PHYSD_ENV"
	env "${extra[@]}" GOMAXPROCS=$SRV_PROCS "${SRV_PIN[@]}" "$@" >/dev/null 2>"$log" &
	PID=$!
	PIDS+=("$PID")
	for _ in $(seq 400); do
		grep -q '"msg":"ready"' "$log" 2>/dev/null && break
		sleep 0.025
	done
	# || true: under set -e a grep that finds nothing would end the script
	# without the message below.
	ADDR=$(grep -m1 '"msg":"listening"' "$log" | sed -E 's/.*"addr":"([^"]+)".*/\1/' || true)
	[[ -n "$ADDR" ]] || { echo "$name did not start:" >&2; cat "$log" >&2; exit 1; }
}

# lg ARGS... : one loadgen measurement, appended to the raw results.
lg() { "${GEN_PIN[@]}" "$LG" -json "$@" | tee -a "$RAW" | summarize; }
summarize() {
	sed -E 's/.*"tags":\{([^}]*)\}.*"calls":([0-9]+),"errors":([0-9]+).*"rps":([0-9.]+),"p50_us":([0-9.]+),"p90_us":[0-9.]+,"p99_us":([0-9.]+).*/  \1 calls=\2 errors=\3 rps=\4 p50_us=\5 p99_us=\6/' >&2
}
rss() { # NAME PID WHEN
	local kb hwm
	kb=$(awk '/^VmRSS:/{print $2}' "/proc/$2/status")
	hwm=$(awk '/^VmHWM:/{print $2}' "/proc/$2/status")
	echo "{\"kind\":\"rss\",\"tags\":{\"server\":\"$1\",\"when\":\"$3\"},\"vmrss_kb\":$kb,\"vmhwm_kb\":$hwm}" | tee -a "$RAW" >&2
}

GH=examples/greenhouse/physmcp.manifest.yml

echo "== (d) idle instances: start, a few calls, VmRSS (again after >= 30 s idle at the end)" >&2
start physd_idle "$PHYSD" run --manifest $GH --http 127.0.0.1:0 --state "$STATE_ROOT/idle"
IDLE_P=$PID IDLE_PA=$ADDR
start bare_idle "$BARE"
IDLE_B=$PID IDLE_BA=$ADDR
"$LG" -url "http://$IDLE_PA/mcp" -kind read -n 20 -warmup 0 >/dev/null
"$LG" -url "http://$IDLE_PA/mcp" -kind do -n 5 -warmup 0 >/dev/null
"$LG" -url "http://$IDLE_PA/mcp" -kind cando -n 5 -warmup 0 >/dev/null
"$LG" -url "http://$IDLE_BA/mcp" -kind echo -n 30 -warmup 0 >/dev/null
sleep 1
rss physd "$IDLE_P" after_calls
rss bare "$IDLE_B" after_calls
IDLE_T0=$(date +%s)

echo "== servers under test: GOMAXPROCS=$SRV_PROCS pin=$PIN state=$STATE_ROOT" >&2
start physd "$PHYSD" run --manifest $GH --http 127.0.0.1:0 --state "$STATE_ROOT/gh"
P=$PID PA=$ADDR
start bare "$BARE"
B=$PID BA=$ADDR
start raw "$BARE" --raw
R=$PID RA=$ADDR
start physd50 "$PHYSD" run --manifest bench/manifest50.yml --http 127.0.0.1:0 --state "$STATE_ROOT/m50"
P50=$PID P50A=$ADDR
if [[ -n "$BEFORE_REF" ]]; then
	# The before binary reads the manifests of its own tree: this tree's
	# may use keys it does not know (safe, lease).
	start physd_before "$BEFORE" run --manifest "$WORK/before/$GH" --http 127.0.0.1:0 --state "$STATE_ROOT/gh_before"
	Q=$PID QA=$ADDR
	start physd50_before "$BEFORE" run --manifest "$WORK/before/bench/manifest50.yml" --http 127.0.0.1:0 --state "$STATE_ROOT/m50_before"
	Q50=$PID Q50A=$ADDR
fi

measure_read() { # SERVER PAIR ORDER
	local url pid kind
	case $1 in
	physd) url=http://$PA/mcp pid=$P kind=read ;;
	bare) url=http://$BA/mcp pid=$B kind=echo ;;
	raw) url=http://$RA/mcp pid=$R kind=echo ;;
	before) url=http://$QA/mcp pid=$Q kind=read ;;
	esac
	lg -url "$url" -pid "$pid" -kind $kind -c 8 -d "${TPUT_S}s" -warmup 500ms \
		-tag phase=read -tag server="$1" -tag mode=tput -tag pair="$2" -tag order="$3"
	lg -url "$url" -pid "$pid" -kind $kind -c 1 -d "${LAT_S}s" -warmup 300ms \
		-tag phase=read -tag server="$1" -tag mode=lat -tag pair="$2" -tag order="$3"
}

echo "== (a) read_ cache hit (c=8 throughput, c=1 latency), $PAIRS alternating pairs" >&2
for i in $(seq "$PAIRS"); do
	if ((i % 2)); then order=(physd bare raw); else order=(raw bare physd); fi
	[[ -n "$BEFORE_REF" ]] && order+=(before)
	ord=$(IFS=,; echo "${order[*]}")
	for s in "${order[@]}"; do measure_read "$s" "$i" "$ord"; done
done
rss physd "$P" after_load
rss bare "$B" after_load

echo "== (b) do_ full path, c=1, state on $(df --output=source,fstype "$STATE_ROOT" | tail -1)" >&2
for i in $(seq "$ROUNDS"); do
	do_p() { lg -url "http://$PA/mcp" -pid "$P" -kind do -c 1 -d "${DO_S}s" -warmup 300ms -tag phase=do -tag server=physd -tag pair="$i"; }
	do_b() { lg -url "http://$BA/mcp" -pid "$B" -kind echo -c 1 -d "${LAT_S}s" -warmup 300ms -tag phase=do -tag server=bare -tag pair="$i"; }
	do_q() { lg -url "http://$QA/mcp" -pid "$Q" -kind do -c 1 -d "${DO_S}s" -warmup 300ms -tag phase=do -tag server=before -tag pair="$i"; }
	if ((i % 2)); then do_p; do_b; else do_b; do_p; fi
	[[ -n "$BEFORE_REF" ]] && do_q
done

echo "== (c) can_do, 50 capabilities, c=1" >&2
for i in $(seq "$ROUNDS"); do
	cd_p() { lg -url "http://$P50A/mcp" -pid "$P50" -kind cando -c 1 -d "${CANDO_S}s" -warmup 300ms -tag phase=cando -tag server=physd -tag pair="$i"; }
	cd_b() { lg -url "http://$BA/mcp" -pid "$B" -kind echo -c 1 -d "${LAT_S}s" -warmup 300ms -tag phase=cando -tag server=bare -tag pair="$i"; }
	cd_q() { lg -url "http://$Q50A/mcp" -pid "$Q50" -kind cando -c 1 -d "${CANDO_S}s" -warmup 300ms -tag phase=cando -tag server=before -tag pair="$i"; }
	if ((i % 2)); then cd_p; cd_b; else cd_b; cd_p; fi
	[[ -n "$BEFORE_REF" ]] && cd_q
done

echo "== (e) start to ready, $STARTS starts (fresh state directory each)" >&2
kill "$P" "$B" "$R" "$P50" ${Q:+"$Q"} ${Q50:+"$Q50"}
wait "$P" "$B" "$R" "$P50" ${Q:+"$Q"} ${Q50:+"$Q50"} 2>/dev/null || true
read -ra PENV <<<"$PHYSD_ENV"
env "${PENV[@]}" GOMAXPROCS=$SRV_PROCS "${SRV_PIN[@]}" "$LG" startup -json -n "$STARTS" -state-root "$STATE_ROOT" -tag server=physd -- \
	"$PHYSD" run --manifest $GH --http 127.0.0.1:0 | tee -a "$RAW" >&2

left=$((30 - ($(date +%s) - IDLE_T0)))
((left > 0)) && sleep "$left"
rss physd "$IDLE_P" idle_30s
rss bare "$IDLE_B" idle_30s

LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
MD=$OUT.md
HDR=(
	"# physd benchmark results"
	""
	"- date: $(date -u +%Y-%m-%dT%H:%MZ); host: $(nproc) CPUs ($(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)), $(uname -sr); $(go version | cut -d' ' -f3-)"
	"- command: \`${ENVLINE}${CMDLINE}\` (from the module root)"
	"- servers: physd (examples/greenhouse, sim device latency 0) vs bench/baresdk (bare go-sdk v1.8.0, one \`echo\` tool via typed mcp.AddTool; same StreamableHTTPOptions{Stateless, JSONResponse} and http.Server settings); all GOMAXPROCS=$SRV_PROCS; taskset pinning: $([[ $PIN == 1 ]] && echo "servers on CPU $SRV_CPUS, loadgen on CPU $GEN_CPUS" || echo none); built with \`go build -trimpath\`"
	"- load: bench/loadgen, raw 2026-07-28 JSON-RPC tools/call over keep-alive loopback HTTP; c=8 for ${TPUT_S} s (throughput), c=1 for ${LAT_S} s (latency); do_ ${DO_S} s and can_do ${CANDO_S} s per round, $ROUNDS rounds alternating with the bare server"
	"- machine load (1/5/15-min loadavg) at start: $LOAD0, at end: $LOAD1 (anything above ~1 means other processes competed for the $(nproc) CPUs)"
	"- physd extra environment: ${PHYSD_ENV:-none}; code: $(git rev-parse --short HEAD 2>/dev/null || echo ?) plus uncommitted work in the tree at run time"
	"- state directory (ledger + audit, fsynced): $STATE_ROOT on $(df --output=source,fstype "$STATE_ROOT" | tail -1 | tr -s ' ')"
)
ARGS=()
for h in "${HDR[@]}"; do ARGS+=(-h "$h"); done
"$LG" report -in "$RAW" -md "$MD" -before "$BEFORE_REF" "${ARGS[@]}"
cp "$RAW" "$OUT.raw.jsonl"
echo >&2
echo "wrote $MD and $OUT.raw.jsonl" >&2
