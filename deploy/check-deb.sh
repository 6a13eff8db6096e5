#!/usr/bin/env bash
# Builds the amd64 Debian package and checks it from the outside:
#   1. dpkg-deb: control fields, the exact file list with modes, conffiles,
#      the maintainer scripts (present, executable, valid sh), and that the
#      unit's ExecStart, --manifest and --policy name files the package installs;
#      lintian too where it is installed (CI does not install it);
#   2. dpkg-deb -x into a temporary root: the extracted physd validates the
#      installed example;
#   3. as root, where overlayfs works: dpkg -i in a chroot whose /usr, /etc and
#      /var are copy-on-write layers over this machine's (nothing here changes):
#      the postinst creates the physd user in i2c, gpio and dialout and the
#      groups that were missing, /etc/physd and /var/lib/physd get their
#      owners, physd validates the example as the physd user and runs it with
#      the unit's command line (ready, ledger and audit in /var/lib/physd,
#      physd audit verify, "stopped" on SIGTERM); a reinstall keeps an edited conffile; remove and purge run.
# Run by .ci/run; under 10 s with a warm build cache.
set -euo pipefail
export GOTOOLCHAIN=go1.27.3
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check-deb: FAIL: $*" >&2; exit 1; }

version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$tmp/physd" ./cmd/physd
deb=$(deploy/deb/build.sh amd64 "$version" "$tmp/physd" "$tmp/out" 2>"$tmp/nfpm.log") || { cat "$tmp/nfpm.log" >&2; fail "nfpm"; }
echo "built $(basename "$deb") ($(du -h "$deb" | cut -f1))"

# ---- 1. dpkg-deb: control, contents, conffiles, maintainer scripts ---------
[ "$(dpkg-deb -f "$deb" Package)" = physd ] || fail "Package is not physd"
[ "$(dpkg-deb -f "$deb" Architecture)" = amd64 ] || fail "Architecture is not amd64"
[ "$(dpkg-deb -f "$deb" Depends)" = passwd ] || fail "Depends is not passwd (useradd, groupadd)"
dpkg-deb -f "$deb" Version | grep -Eq '^[0-9]' || fail "Version does not start with a digit"

# Every path with its mode, directories included (owners are fixed by the postinst).
dpkg-deb --fsys-tarfile "$deb" | tar -tvf - | awk '{sub("^\\./", "", $6); print $1, $2, "/" $6}' | sed 's|/$||' | sort -k3 > "$tmp/contents"
cat > "$tmp/want" <<'LIST'
drwxr-xr-x root/root /etc
drwxr-x--- root/root /etc/physd
-rw-r--r-- root/root /etc/physd/physmcp.manifest.yml
-rw-r--r-- root/root /etc/physd/physmcp.policy.yml
drwxr-xr-x root/root /usr
drwxr-xr-x root/root /usr/bin
-rwxr-xr-x root/root /usr/bin/physd
drwxr-xr-x root/root /usr/lib
drwxr-xr-x root/root /usr/lib/systemd
drwxr-xr-x root/root /usr/lib/systemd/system
-rw-r--r-- root/root /usr/lib/systemd/system/physd.service
drwxr-xr-x root/root /usr/share
drwxr-xr-x root/root /usr/share/doc
drwxr-xr-x root/root /usr/share/doc/physd
-rw-r--r-- root/root /usr/share/doc/physd/changelog.gz
-rw-r--r-- root/root /usr/share/doc/physd/copyright
drwxr-xr-x root/root /usr/share/lintian
drwxr-xr-x root/root /usr/share/lintian/overrides
-rw-r--r-- root/root /usr/share/lintian/overrides/physd
drwxr-xr-x root/root /usr/share/physd
drwxr-xr-x root/root /usr/share/physd/schemas
-rw-r--r-- root/root /usr/share/physd/schemas/physmcp.manifest.schema.json
-rw-r--r-- root/root /usr/share/physd/schemas/physmcp.policy.schema.json
drwxr-xr-x root/root /var
drwxr-xr-x root/root /var/lib
drwxr-x--- root/root /var/lib/physd
LIST
diff -u "$tmp/want" "$tmp/contents" || fail "the package's files differ from the list above (- wanted, + built)"
echo "contents: $(grep -vc '^d' "$tmp/contents") files, $(grep -c '^d' "$tmp/contents") directories, as listed"

dpkg-deb -e "$deb" "$tmp/control"
printf '/etc/physd/physmcp.manifest.yml\n/etc/physd/physmcp.policy.yml\n' | diff -u - "$tmp/control/conffiles" || fail "conffiles"
for s in postinst prerm postrm; do
  [ -x "$tmp/control/$s" ] || fail "$s missing or not executable"
  sh -n "$tmp/control/$s" || fail "$s: not valid sh"
done
for want in 'groupadd --system "$g"' 'useradd --system' 'usermod --append --groups i2c,gpio,dialout physd' 'chown physd:physd /var/lib/physd'; do
  grep -qF "$want" "$tmp/control/postinst" || fail "postinst lacks: $want"
done
echo "control: conffiles and maintainer scripts as expected"
if command -v lintian >/dev/null; then
  lintian --fail-on error,warning --suppress-tags no-manual-page "$deb" >"$tmp/lintian" 2>&1 || { cat "$tmp/lintian" >&2; fail "lintian"; }
  echo "lintian: no errors or warnings (no-manual-page aside)"
fi

# ---- 2. extract and validate the installed example -------------------------
root=$tmp/root
dpkg-deb -x "$deb" "$root"
unit=$root/usr/lib/systemd/system/physd.service
exec_bin=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit")
[ -x "$root$exec_bin" ] || fail "the unit's ExecStart $exec_bin is not in the package"
for flag in --manifest --policy; do
  path=$(tr -d '\\\n' < "$unit" | grep -o -- "$flag [^ ]*" | cut -d' ' -f2)
  [ -f "$root$path" ] || fail "the unit's $flag $path is not in the package"
done
grep -q '^User=physd$' "$unit" && grep -q '^StateDirectory=physd$' "$unit" || fail "the unit does not run as physd with StateDirectory=physd"
head -1 "$root/etc/physd/physmcp.manifest.yml" | grep -qF '$schema=/usr/share/physd/schemas/physmcp.manifest.schema.json' \
  || fail "the installed manifest's schema line does not point at /usr/share/physd/schemas"
"$root/usr/bin/physd" version > "$tmp/version" || fail "physd version"
head -1 "$tmp/version"
"$root/usr/bin/physd" validate --policy "$root/etc/physd/physmcp.policy.yml" "$root/etc/physd/physmcp.manifest.yml" \
  || fail "physd validate on the extracted example"

# ---- 3. dpkg -i in a copy-on-write chroot -----------------------------------
if [ "$(id -u)" != 0 ]; then
  echo "chroot install: skipped (needs root; CI runs it)"
  exit 0
fi
cr=$tmp/chroot
mkdir -p "$cr"/{usr,etc,var,tmp,run,dev,proc} "$tmp"/ov/{usr,etc,var}/{up,work}
for l in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$l" ]; then ln -s "$(readlink "/$l")" "$cr/$l"; elif [ -d "/$l" ]; then fail "/$l is not a symlink (not a merged-/usr system)"; fi
done
cp "$deb" "$cr/tmp/physd.deb"
sed -n '/^ExecStart=/,/[^\\]$/p' "$unit" | sed 's/^ExecStart=//; s/\\$//' | { tr '\n' ' '; echo; } > "$cr/tmp/execstart"
cat > "$cr/tmp/check.sh" <<'INNER'
set -eu -o pipefail
trap 'echo "check-deb: FAIL (chroot): check.sh line $LINENO" >&2' ERR
fail() { echo "check-deb: FAIL (chroot): $*" >&2; exit 1; }
dpkg-query -W physd >/dev/null 2>&1 && fail "this machine has the physd package; run the check where it has not"
# A machine as fresh as a Pi's first boot in this layer: no physd user, and
# no i2c or gpio group (Debian has dialout), so the postinst must create them.
if getent passwd physd >/dev/null; then userdel physd; fi
if getent group physd >/dev/null; then groupdel physd; fi
for g in i2c gpio; do if getent group "$g" >/dev/null; then groupdel "$g"; fi; done
missing=""; for g in i2c gpio dialout; do getent group "$g" >/dev/null || missing="$missing $g"; done
[ "$missing" = " i2c gpio" ] || fail "groups missing before the install:$missing (want i2c gpio)"
dpkg -i /tmp/physd.deb >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; fail "dpkg -i"; }
dpkg-query -W -f '${Status}\n' physd | grep -qx 'install ok installed' || fail "dpkg status"
entry=$(getent passwd physd) || fail "no physd user"
case "$entry" in physd:x:*:*:*:/var/lib/physd:/usr/sbin/nologin) ;; *) fail "physd user: $entry" ;; esac
[ "$(id -u physd)" -lt 1000 ] || fail "physd is not a system user (uid $(id -u physd))"
for g in physd i2c gpio dialout; do id -nG physd | tr ' ' '\n' | grep -qx "$g" || fail "physd is not in $g: $(id -nG physd)"; done
for g in $missing; do getent group "$g" | awk -F: '$3 >= 1000 {exit 1}' || fail "group $g is not a system group"; done
[ "$(stat -c '%U:%G %a' /etc/physd)" = "root:physd 750" ] || fail "/etc/physd: $(stat -c '%U:%G %a' /etc/physd)"
[ "$(stat -c '%U:%G %a' /var/lib/physd)" = "physd:physd 750" ] || fail "/var/lib/physd: $(stat -c '%U:%G %a' /var/lib/physd)"
setpriv --reuid physd --regid physd --init-groups \
  physd validate --policy /etc/physd/physmcp.policy.yml /etc/physd/physmcp.manifest.yml >/dev/null \
  || fail "physd validate as the physd user"
echo "dpkg -i: physd user in $(id -nG physd | tr ' ' ','), groups created:${missing:- none}; the physd user validates /etc/physd"
# The unit's command line, as the physd user with systemd's StateDirectory
# (only the port differs): ready, then a clean stop on SIGTERM.
port=$((20000 + $$ % 20000))
read -r -a argv < /tmp/execstart
for i in "${!argv[@]}"; do [ "${argv[$i]}" = --http ] && argv[i+1]=127.0.0.1:$port; done
case "${argv[*]}" in *" --http 127.0.0.1:$port"*) ;; *) fail "the unit's ExecStart has no --http: ${argv[*]}" ;; esac
setpriv --reuid physd --regid physd --init-groups env -i STATE_DIRECTORY=/var/lib/physd \
  "${argv[@]}" 2>/tmp/physd.log &
pid=$!
ready=""
for _ in $(seq 100); do
  if exec 3<>"/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
    printf 'GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
    ready=$(head -1 <&3); exec 3<&-
    case "$ready" in *" 200"*) break ;; esac
  fi
  kill -0 "$pid" 2>/dev/null || { cat /tmp/physd.log; fail "physd run exited"; }
  sleep 0.1
done
case "$ready" in *" 200"*) ;; *) kill "$pid"; cat /tmp/physd.log; fail "/readyz: ${ready:-no answer}" ;; esac
kill -TERM "$pid"; wait "$pid" || { cat /tmp/physd.log; fail "physd run: exit $? on SIGTERM"; }
tail -1 /tmp/physd.log | grep -q '"msg":"stopped"' || { cat /tmp/physd.log; fail "the log does not end with stopped"; }
for f in physd.db audit/audit.jsonl; do
  [ "$(stat -c %U "/var/lib/physd/$f" 2>/dev/null)" = physd ] || fail "/var/lib/physd/$f missing or not owned by physd"
done
setpriv --reuid physd --regid physd --init-groups physd audit verify /var/lib/physd >/tmp/verify.log 2>&1 \
  || { cat /tmp/verify.log; fail "physd audit verify /var/lib/physd"; }
echo "physd run (the unit's command line, as physd): /readyz 200, ledger and audit in /var/lib/physd (audit verify: intact), \"stopped\" on SIGTERM"
echo "# edited by the operator" >> /etc/physd/physmcp.manifest.yml
dpkg -i /tmp/physd.deb >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; fail "dpkg -i again (upgrade path)"; }
tail -1 /etc/physd/physmcp.manifest.yml | grep -qx '# edited by the operator' || fail "reinstall replaced an edited conffile"
dpkg -r physd >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; fail "dpkg -r"; }
[ ! -e /usr/bin/physd ] && [ -f /etc/physd/physmcp.manifest.yml ] || fail "after remove: binary gone, conffiles kept"
dpkg -P physd >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; fail "dpkg -P"; }
[ ! -e /etc/physd/physmcp.manifest.yml ] || fail "purge kept a conffile"
getent passwd physd >/dev/null || fail "purge removed the physd user (it owns the kept audit trail)"
echo "reinstall keeps an edited conffile; remove keeps /etc/physd; purge removes it and keeps the physd user"
INNER
if ! unshare --mount true 2>"$tmp/unshare.err"; then
  echo "chroot install: skipped (no mount namespace here: $(tr '\n' ' ' < "$tmp/unshare.err"))"
  exit 0
fi
set +e
unshare --mount --propagation private bash -euc '
  cr=$1 ov=$2
  for d in usr etc var; do
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$ov/$d/up,workdir=$ov/$d/work" "$cr/$d" || exit 3
  done
  mount --bind /dev "$cr/dev" && mount --bind /proc "$cr/proc" || exit 3
  PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot "$cr" /bin/bash /tmp/check.sh
' _ "$cr" "$tmp/ov" 2>"$tmp/chroot.err"
rc=$?
set -e
case $rc in
0) ;;
3) echo "chroot install: skipped (overlayfs not available here: $(tr '\n' ' ' < "$tmp/chroot.err"))" ;;
*) cat "$tmp/chroot.err" >&2; fail "chroot install (exit $rc)" ;;
esac
