#!/usr/bin/env bash
# Builds the cri-shim .deb (nfpm, build/nfpm.yaml) from binaries built before:
#   build/deb.sh VERSION ARCH BINDIR OUT
# BINDIR holds cri-shim and containerd-shim-cri-shim-v2 for ARCH; the package
# lands in OUT as cri-shim_VERSION_ARCH.deb (VERSION as Debian takes it: it
# starts with a digit). NFPM names the packager; by default OUT/.tools/nfpm,
# built from build/tools (the pinned version) when missing.
#
# What the package carries, and where (docs/operations.md, "The .deb"): the
# binaries in /usr/bin; the units cri-shim.socket, cri-shim.service and
# cri-shim-router.service in /lib/systemd/system, none enabled or started;
# /etc/cri-shim/config.toml as a conffile; and under /usr/share/cri-shim/
# deploy/install.sh with its lib/ and the kubelet, containerd (version 3 and
# version 2) and crictl drop-ins it places, laid out as in deploy/ and
# naming /usr/bin. Installing or upgrading the package must not switch a
# node's kubelet or containerd to another runtime path, so the node steps are
# the operator's: /usr/share/cri-shim/install.sh runs in packaged mode there
# (it does the steps with the package's binaries and places none of its own).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
(($# == 4)) || { echo "usage: build/deb.sh VERSION ARCH BINDIR OUT" >&2; exit 2; }
VERSION=$1 ARCH=$2 BINDIR=$3 OUT=$4
[[ $VERSION =~ ^[0-9] ]] || { echo "build/deb.sh: version $VERSION does not start with a digit" >&2; exit 2; }
for b in cri-shim containerd-shim-cri-shim-v2; do
	[[ -x $BINDIR/$b ]] || { echo "build/deb.sh: no executable $BINDIR/$b" >&2; exit 1; }
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
NFPM=${NFPM:-$OUT/.tools/nfpm}
if [[ ! -x $NFPM ]]; then
	printf '[deb] building nfpm\n' >&2
	(cd "$REPO/build/tools" && go build -trimpath -o "$NFPM" github.com/goreleaser/nfpm/v2/cmd/nfpm)
fi

stage=$(mktemp -d "$OUT/.stage-$ARCH.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/docs"
install -d -m 0755 "$stage/share" "$stage/share/lib" "$stage/share/kubelet" "$stage/share/containerd" "$stage/share/containerd/v2"
cp "$BINDIR/cri-shim" "$BINDIR/containerd-shim-cri-shim-v2" "$stage/"
cp "$REPO/deploy/config.toml" "$REPO/LICENSE" "$stage/"
cp "$REPO"/docs/*.md "$REPO/README.md" "$REPO/CHANGELOG.md" "$stage/docs/"
# /usr/share/cri-shim: install.sh, its lib and the drop-ins, as in deploy/.
install -m 0755 "$REPO/deploy/install.sh" "$stage/share/install.sh"
install -m 0644 "$REPO"/deploy/lib/*.sh "$stage/share/lib/"
install -m 0644 "$REPO/deploy/kubelet/20-cri-shim.conf" "$REPO/deploy/kubelet/50-cri-shim.conf" "$stage/share/kubelet/"
install -m 0644 "$REPO/deploy/crictl.yaml" "$stage/share/"
# deploy/ names the paths deploy/install.sh installs to (/usr/local); the
# package installs the binaries in /usr/bin and the docs in /usr/share/doc.
usr() { sed 's#/usr/local/bin/#/usr/bin/#g; s#file:///usr/local/share/doc/cri-shim/#file:///usr/share/doc/cri-shim/#g' "$REPO/deploy/$1"; }
for f in cri-shim.service cri-shim.socket cri-shim-router.service; do usr "$f" >"$stage/$f"; done
for f in containerd/50-cri-shim.toml containerd/v2/50-cri-shim.toml; do
	usr "$f" >"$stage/share/$f"
	chmod 0644 "$stage/share/$f"
done
cat >"$stage/postinstall.sh" <<'SH'
#!/bin/sh
# Reload units; the shim is not started or enabled here: an operator points
# the kubelet at it deliberately (/usr/share/cri-shim/install.sh,
# docs/operations.md).
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SH
cat >"$stage/preremove.sh" <<'SH'
#!/bin/sh
# Refuse removal while /usr/share/cri-shim/install.sh's node steps are in
# place (its record names no /usr/local/bin/cri-shim: a tarball install's is
# its own install.sh's): the kubelet would be left on a socket nobody serves,
# and install.sh, which undoes the steps, would be gone. Upgrades go on.
set -e
rec=${DPKG_ROOT:-}/var/lib/cri-shim-install/files
if [ "$1" = remove ] && [ -f "$rec" ] && ! grep -qxF 'f /usr/local/bin/cri-shim' "$rec"; then
	echo "cri-shim: the node steps of /usr/share/cri-shim/install.sh are in place ($rec):" >&2
	echo "  undo them first: /usr/share/cri-shim/install.sh --uninstall" >&2
	exit 1
fi
SH
cat >"$stage/postremove.sh" <<'SH'
#!/bin/sh
# Forget the removed units.
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SH
# nfpm expands variables in some fields only: fill the template here.
sed -e "s#\${STAGE}#$stage#g" -e "s#\${VERSION}#$VERSION#g" -e "s#\${ARCH}#$ARCH#g" \
	"$REPO/build/nfpm.yaml" >"$stage/nfpm.yaml"
"$NFPM" package --config "$stage/nfpm.yaml" --packager deb --target "$OUT/" >/dev/null
