#!/usr/bin/env bash
# govulncheck for physd without reaching vuln.go.dev: the Go vulnerability
# database's OSV records ship in the golang.org/x/vulndb module (data/osv),
# which the Go module proxy serves; vulndb's own cmd/indexdb turns them into
# the v1 database layout that `govulncheck -db file://…` reads.
#
#   deploy/vulncheck.sh                 # scan ./... against the pinned snapshot
#   deploy/vulncheck.sh -show verbose   # extra arguments go to govulncheck
#   deploy/vulncheck.sh --online        # scan against https://vuln.go.dev instead
#   VULNDB_VERSION=v0.0.0-… deploy/vulncheck.sh   # another snapshot of x/vulndb
#
# The snapshot knows the vulnerabilities published up to its date (the
# pseudo-version's timestamp); move VULNDB_VERSION forward to learn newer
# ones. The built database is cached in ${XDG_CACHE_HOME:-~/.cache}/physd/.
# Exit status is govulncheck's: 0 nothing reachable, 3 vulnerabilities found.
set -euo pipefail
# physd builds with go1.27.3 (go.mod); machines that pin GOTOOLCHAIN=local need it named.
export GOTOOLCHAIN=go1.27.3
cd "$(dirname "$0")/.."
GOVULNCHECK=golang.org/x/vuln/cmd/govulncheck@v1.9.0
VULNDB_VERSION=${VULNDB_VERSION:-v0.0.0-20261105234957-e22db6528018}

if [ "${1:-}" = --online ]; then
  shift
  exec go run "$GOVULNCHECK" "$@" ./...
fi

db=${XDG_CACHE_HOME:-$HOME/.cache}/physd/vulndb-$VULNDB_VERSION
if [ ! -f "$db/index/db.json" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # Outside physd's module: neither download touches go.mod or go.sum.
  src=$(cd "$work" && go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  if [ ! -d "$src/data/osv" ]; then
    echo "vulncheck: golang.org/x/vulndb@$VULNDB_VERSION has no data/osv directory" >&2; exit 1
  fi
  (cd "$work" && go run "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION" -vulns "$src/data/osv" -out "$work/db")
  mkdir -p "$(dirname "$db")"
  rm -rf "$db" && mv "$work/db" "$db"
fi
stamp=${VULNDB_VERSION#v0.0.0-}
echo "vulnerability database: golang.org/x/vulndb@$VULNDB_VERSION (snapshot of ${stamp:0:4}-${stamp:4:2}-${stamp:6:2}, $(ls "$db/ID" | grep -c "\.json$") entries)"
go run "$GOVULNCHECK" -db "file://$db" "$@" ./...
