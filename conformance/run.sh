#!/usr/bin/env bash
# Outside-in checks of physd with other people's clients.
#
#   conformance/run.sh            # both parts below
#   conformance/run.sh suite      # MCP conformance suite, 2026-07-28 and 2025-11-25
#   conformance/run.sh ts         # TypeScript SDK v2 client (conformance/ts-client), HTTP, stdio and HTTPS,
#                                 # and its OAuth client against the zitadel OP (e2e TestOAuthTSClient)
#
# Installs Node 22 and the pinned npm packages (package-lock.json) into
# conformance/node_modules with `npm ci`, only when the lockfile changed;
# builds physd; starts it on examples/greenhouse on an ephemeral loopback
# port. Full output goes to conformance/out/; this script prints one short
# line per part, never a "N passed, N failed" line (CI reads the last such
# line of its log). Exit status: 0 all good, 1 a check failed.
# PHYSD_BIN=/path/to/physd uses that binary instead of building one.
set -euo pipefail
# physd builds with go1.27.3 (go.mod); machines that pin GOTOOLCHAIN=local need it named.
export GOTOOLCHAIN=go1.27.3

CONF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$CONF/.." && pwd)
OUT=$CONF/out
MANIFEST=$ROOT/examples/greenhouse/physmcp.manifest.yml
POLICY=$ROOT/examples/greenhouse/physmcp.policy.yml
ERAS=(2026-07-28 2025-11-25)
mkdir -p "$OUT"
rel() { echo "${1#"$ROOT"/}"; }

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(suite ts)

# --- Node 22 and the npm packages ---------------------------------------
setup_node() {
  local stamp=$CONF/node_modules/.physd-lock.sha256 want
  want=$(sha256sum "$CONF/package-lock.json" | cut -d' ' -f1)
  if [ ! -x "$CONF/node_modules/.bin/node" ] || [ ! -x "$CONF/node_modules/.bin/conformance" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    if ! (cd "$CONF" && npm ci --no-audit --no-fund) >"$OUT/npm-ci.log" 2>&1; then
      echo "conformance: npm ci failed (see $(rel "$OUT/npm-ci.log")):"; tail -20 "$OUT/npm-ci.log"; return 1
    fi
    echo "$want" >"$stamp"
  fi
  export PATH=$CONF/node_modules/.bin:$PATH
  local v
  v=$(node --version)
  if [[ $v != v22.* ]]; then
    echo "conformance: node_modules/.bin/node is $v, want v22 (the npm package 'node' runs an install script; is it allowed?)"; return 1
  fi
}

# --- physd ---------------------------------------------------------------
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

build_physd() {
  if [ -n "${PHYSD_BIN:-}" ]; then # test another build (e.g. a candidate fix)
    cp "$PHYSD_BIN" "$OUT/physd"; return 0
  fi
  if ! (cd "$ROOT" && go build -o "$OUT/physd" ./cmd/physd) >"$OUT/build.log" 2>&1; then
    echo "conformance: go build failed:"; cat "$OUT/build.log"; return 1
  fi
}

# start_physd NAME [ARGS...]: runs physd on 127.0.0.1:0, sets URL.
start_physd() {
  local name=$1; shift
  local log=$OUT/physd-$name.log state=$OUT/state-$name
  rm -rf "$state"
  "$OUT/physd" run --manifest "$MANIFEST" --state "$state" --http 127.0.0.1:0 "$@" 2>"$log" &
  PIDS+=($!)
  local i addr=""
  for i in $(seq 200); do
    if grep -q '"msg":"ready"' "$log" 2>/dev/null; then
      addr=$(grep -o '"msg":"listening","addr":"[^"]*"' "$log" | head -1 | sed 's/.*"addr":"//; s/"$//')
      break
    fi
    sleep 0.1
  done
  if [ -z "$addr" ]; then
    echo "conformance: physd did not start (see $(rel "$log")):"; tail -5 "$log"; return 1
  fi
  URL=http://$addr/mcp
}

# --- the conformance suite ------------------------------------------------
run_suite() {
  start_physd suite
  local rc=0 era log res failed_names
  for era in "${ERAS[@]}"; do
    log=$OUT/conformance-$era.log
    res=$OUT/results-$era
    rm -rf "$res"
    set +e
    conformance server --url "$URL" --requirements "$era" \
      --expected-failures "$CONF/baseline-$era.yml" -o "$res" >"$log" 2>&1
    local code=$?
    set -e
    local clean=0 failing=0 header=missing parsed=0
    conformance list --server --requirements "$era" >"$OUT/scenarios-$era.txt" 2>&1 || true
    eval "$(node "$CONF/summarize.mjs" "$log" "$OUT/scenarios-$era.txt")"
    local extra=""
    [ "$parsed" = 1 ] || { extra=" no summary in the log;"; code=1; }
    # Pending in this release, so never scored; it applies to every HTTP
    # server, so physd must pass it anyway.
    if [ "$era" = 2026-07-28 ] && [ "$header" != ok ]; then
      extra="$extra http-header-validation: $header;"; code=1
    fi
    if [ "$code" -eq 0 ]; then
      echo "conformance $era: ok ($clean scored scenarios clean, $failing with baselined fixture-only checks; log $(rel "$log"))"
    else
      failed_names=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | sed -n '/Unexpected failures\|Stale baseline entries/,/^$/p' | grep -E '^  (✗|✓) ' | sed 's/^  //' | tr '\n' ' ')
      echo "conformance $era: FAILED;$extra baseline check: ${failed_names:-see log} (log $(rel "$log"))"
      rc=1
    fi
  done
  return $rc
}

# --- the TypeScript client ------------------------------------------------
# Over plain HTTP, stdio and HTTPS: a throw-away CA from conformance/testca
# signs physd's certificate, and Node trusts it through NODE_EXTRA_CA_CERTS.
run_ts() {
  local log=$OUT/ts-client.log tlsdir=$OUT/tls
  rm -rf "$tlsdir"
  if ! (cd "$ROOT" && go run ./conformance/testca -dir "$tlsdir") >"$OUT/testca.log" 2>&1; then
    echo "conformance: conformance/testca failed:"; cat "$OUT/testca.log"; return 1
  fi
  set +e
  NODE_EXTRA_CA_CERTS=$tlsdir/ca.pem node "$CONF/ts-client/orchestrate.mjs" --physd "$OUT/physd" --manifest "$MANIFEST" --policy "$POLICY" \
    --tls-dir "$tlsdir" >"$log" 2>&1
  local code=$?
  set -e
  if [ "$code" -ne 0 ]; then
    grep '^FAIL' "$log" | head -20 || true
  fi
  echo "$(tail -1 "$log") (log $(rel "$log"))"
  return $code
}

# The SDK's OAuth client (conformance/ts-client/oauth.mjs) against physd
# behind the zitadel OP: the OP lives in the e2e tests' Go code, so the e2e
# test that starts both runs it (required here: it skips without Node).
run_ts_oauth() {
  local log=$OUT/ts-oauth.log code
  set +e
  (cd "$ROOT" && PHYSD_REQUIRE_TS=1 go test -count=1 -run '^TestOAuthTSClient$' -v ./e2e) >"$log" 2>&1
  code=$?
  set -e
  if [ "$code" -ne 0 ]; then
    grep -E '"ok":false|FAIL|Error' "$log" | head -20 || true
    echo "ts-client oauth: failed (log $(rel "$log"))"
  else
    echo "ts-client oauth: discovery, client_credentials, step-up, read_/can_do/do_ ok (log $(rel "$log"))"
  fi
  return $code
}

setup_node
build_physd
rc=0
for p in "${parts[@]}"; do
  case $p in
    suite) run_suite || rc=1 ;;
    ts) run_ts || rc=1; run_ts_oauth || rc=1 ;;
    *) echo "usage: conformance/run.sh [suite] [ts]"; exit 2 ;;
  esac
done
exit $rc
