#!/usr/bin/env bash
# Distributed can_do over real gateway processes: SIZES gateways (physd
# binaries) on 127.0.0.11…, every one owning a fan, max_peers MAX_PEERS
# (default 10); an MCP
# client on gw_01 asks a "ventilation" can_do N times, one after another,
# and every answer must be complete (one candidate per gateway). Prints
# p50/p99/max per size (e2e/TestMeshCanDoBench).
#
#   bench/mesh_cando.sh                    # 3, 10 and 30 gateways, 300 calls each (~3 min)
#   SIZES=30 N=1000 MAX_PEERS=30 bench/mesh_cando.sh
#
# Needs: go; Linux (127.0.0.x addresses without setup).
set -euo pipefail
export GOTOOLCHAIN=go1.27.3
cd "$(dirname "$0")/.."
SIZES=${SIZES:-3,10,30}
N=${N:-300}
MAX_PEERS=${MAX_PEERS:-10}
PHYSD_MESH_BENCH=$SIZES PHYSD_MESH_BENCH_N=$N PHYSD_MESH_BENCH_MAX_PEERS=$MAX_PEERS go test ./e2e -run '^TestMeshCanDoBench$' -count=1 -v -timeout 30m |
	grep -E 'REPORT|FAIL|^ok' | sed 's/.*REPORT //'
