#!/usr/bin/env bash
# Packages a physd binary as a Debian package with nfpm (pinned in
# deploy/deb/go.mod, apart from physd's own module):
#   deploy/deb/build.sh DEB_ARCH VERSION BINARY OUTDIR   → OUTDIR/physd_<debversion>_<arch>.deb (its path on stdout)
# DEB_ARCH is amd64, arm64 or armhf; VERSION is physd's (v0.1.0, or a git
# describe such as 11df556-dirty, which becomes 0.0.0~git11df556.dirty).
set -euo pipefail
export GOTOOLCHAIN=go1.27.3
[ $# -eq 4 ] || { echo "usage: $0 DEB_ARCH VERSION BINARY OUTDIR" >&2; exit 2; }
arch=$1 version=$2 binary=$3 outdir=$4
case "$arch" in amd64|arm64|armhf) ;; *) echo "$0: DEB_ARCH must be amd64, arm64 or armhf, not $arch" >&2; exit 2 ;; esac
[ -x "$binary" ] || { echo "$0: $binary is not an executable" >&2; exit 2; }
binary=$(realpath "$binary")
mkdir -p "$outdir"
outdir=$(realpath "$outdir")
cd "$(dirname "$0")/../.."

# Debian versions start with a digit and use '-' only before the revision:
# v0.1.0 → 0.1.0, v0.1.0-3-gabc → 0.1.0+3.gabc, 11df556-dirty → 0.0.0~git11df556.dirty.
debversion=${version#v}
[[ $debversion =~ ^[0-9]+\.[0-9]+ ]] || debversion="0.0.0~git$debversion"
if [[ $debversion =~ ^([0-9]+\.[0-9]+\.[0-9]+)-(.+)$ ]]; then
  debversion="${BASH_REMATCH[1]}+${BASH_REMATCH[2]}"
fi
debversion=${debversion//-/.}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# nfpm builds from the pinned module, in the Go build cache after the first time.
(cd deploy/deb && go build -o "$tmp/nfpm" github.com/goreleaser/nfpm/v2/cmd/nfpm)

# File times from the commit, so that a rebuild of one commit is byte-identical.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH

# The staging directory nfpm.yaml names. The example greenhouse becomes
# /etc/physd; its schema lines point at the schemas the package installs.
stage=$tmp/stage
mkdir -p "$stage/etc" "$stage/schemas"
cp "$binary" "$stage/physd"
cp deploy/physd.service deploy/deb/copyright deploy/deb/lintian-overrides deploy/deb/postinst deploy/deb/prerm deploy/deb/postrm "$stage/"
cp schemas/physmcp.manifest.schema.json schemas/physmcp.policy.schema.json "$stage/schemas/"
for f in physmcp.manifest.yml physmcp.policy.yml; do
  sed '1s|^# yaml-language-server: \$schema=\.\./\.\./schemas/|# yaml-language-server: $schema=/usr/share/physd/schemas/|' \
    "examples/greenhouse/$f" > "$stage/etc/$f"
done

# A one-entry changelog (Debian wants one): the version and the commit.
maintainer=${PHYSD_DEB_MAINTAINER:-physd maintainers <maintainers@physd.invalid>}
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
printf 'physd (%s) stable; urgency=medium\n\n  * physd %s, built from commit %s.\n\n -- %s  %s\n' \
  "$debversion" "$version" "$commit" "$maintainer" "$(date -u -R -d "@$SOURCE_DATE_EPOCH")" | gzip -n -9 > "$stage/changelog.gz"

deb="$outdir/physd_${debversion}_${arch}.deb"
config=$(realpath deploy/deb/nfpm.yaml)
(cd "$stage" &&
  PHYSD_DEB_ARCH=$arch PHYSD_DEB_VERSION=$debversion \
  PHYSD_DEB_MAINTAINER=$maintainer \
  "$tmp/nfpm" package --config "$config" --packager deb --target "$deb" >&2)
echo "$deb"
