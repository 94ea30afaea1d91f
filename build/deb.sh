#!/usr/bin/env bash
# Builds the cri-shim .deb (nfpm, build/nfpm.yaml) from binaries built before:
#   build/deb.sh VERSION ARCH BINDIR OUT
# BINDIR holds cri-shim and containerd-shim-cri-shim-v2 for ARCH; the package
# lands in OUT as cri-shim_VERSION_ARCH.deb (VERSION as Debian takes it: it
# starts with a digit). NFPM names the packager; by default OUT/.tools/nfpm,
# built from build/tools (the pinned version) when missing.
#
# What the package carries, and where (docs/operations.md, "Release
# artifacts"): the binaries in /usr/bin; the units cri-shim.socket,
# cri-shim.service and cri-shim-router.service in /lib/systemd/system, none
# enabled or started; /etc/cri-shim/config.toml as a conffile; and the
# kubelet, containerd and crictl drop-ins under /usr/share/cri-shim/, for the
# operator to place: installing or upgrading a package must not switch a
# node's kubelet or containerd to another runtime path.
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
cp "$BINDIR/cri-shim" "$BINDIR/containerd-shim-cri-shim-v2" "$stage/"
cp "$REPO/deploy/config.toml" "$REPO/deploy/crictl.yaml" "$REPO/deploy/kubelet/20-cri-shim.conf" \
	"$REPO/deploy/kubelet/50-cri-shim.conf" "$REPO/LICENSE" "$stage/"
cp "$REPO"/docs/*.md "$REPO/README.md" "$REPO/CHANGELOG.md" "$stage/docs/"
# deploy/ names the paths deploy/install.sh installs to (/usr/local); the
# package installs the binaries in /usr/bin and the docs in /usr/share/doc.
for f in cri-shim.service cri-shim.socket cri-shim-router.service containerd/50-cri-shim.toml; do
	sed 's#/usr/local/bin/#/usr/bin/#g; s#file:///usr/local/share/doc/cri-shim/#file:///usr/share/doc/cri-shim/#g' \
		"$REPO/deploy/$f" >"$stage/$(basename "$f")"
done
cat >"$stage/postinstall.sh" <<'SH'
#!/bin/sh
# Reload units; the shim is not started or enabled here: an operator points
# the kubelet at it deliberately (/usr/share/cri-shim, docs/operations.md).
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
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
