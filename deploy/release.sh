#!/usr/bin/env bash
# Builds static physd binaries for Raspberry Pi-class gateways and x86:
#   deploy/release.sh [VERSION]   → dist/physd-VERSION-linux-{arm64,armv6,armv7,amd64}(.sha256)
set -euo pipefail
# physd builds with go1.27.3 (go.mod); machines that pin GOTOOLCHAIN=local need it named.
export GOTOOLCHAIN=go1.27.3
cd "$(dirname "$0")/.."
version=${1:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
mkdir -p dist
for target in linux/arm64 linux/arm/6 linux/arm/7 linux/amd64; do
  IFS=/ read -r goos goarch goarm <<<"$target"
  name="physd-$version-$goos-$goarch${goarm:+v$goarm}"
  CGO_ENABLED=0 GOOS=$goos GOARCH=$goarch GOARM=${goarm:-} \
    go build -trimpath -ldflags "-s -w -X main.version=$version" -o "dist/$name" ./cmd/physd
  (cd dist && sha256sum "$name" > "$name.sha256")
  echo "dist/$name $(du -h "dist/$name" | cut -f1)"
done
