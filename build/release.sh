#!/usr/bin/env bash
# Builds the release artifacts into OUT (default _output/release):
#   cri-shim-VERSION-linux-ARCH.tar.gz  static binary, deploy files, docs, LICENSE
#   cri-shim_VERSION_ARCH.deb           Debian package (nfpm, build/nfpm.yaml)
#   SHA256SUMS                          checksums of all of them
#   build/release.sh VERSION [OUT] [ARCH...]
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSION=${1:?usage: release.sh VERSION [OUT] [ARCH...]}
VERSION=${VERSION#v}
# Package versions start with a digit: an untagged build is 0.0.0~git<describe>.
[[ $VERSION =~ ^[0-9]+\.[0-9]+ ]] || VERSION=0.0.0~git$VERSION
OUT=$(mkdir -p "${2:-$REPO/_output/release}" && cd "${2:-$REPO/_output/release}" && pwd)
shift $(($# >= 2 ? 2 : 1))
ARCHES=("$@")
((${#ARCHES[@]})) || ARCHES=(amd64 arm64)
log() { printf '[release] %s\n' "$*" >&2; }

NFPM=$OUT/.tools/nfpm
if [[ ! -x $NFPM ]]; then
	log "building nfpm"
	(cd "$REPO/build/tools" && go build -trimpath -o "$NFPM" github.com/goreleaser/nfpm/v2/cmd/nfpm)
fi

for arch in "${ARCHES[@]}"; do
	stage=$OUT/.stage-$arch
	rm -rf "$stage"
	mkdir -p "$stage/docs"
	log "building cri-shim $VERSION for linux/$arch"
	(cd "$REPO" && CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath \
		-ldflags "-X github.com/cri-shim/cri-shim/internal/version.Version=$VERSION -X github.com/cri-shim/cri-shim/internal/version.Revision=$(git rev-parse HEAD) -X github.com/cri-shim/cri-shim/internal/version.CommitTime=$(git log -1 --format=%cI)" \
		-o "$stage/cri-shim" ./cmd/cri-shim &&
		CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -o "$stage/containerd-shim-cri-shim-v2" ./cmd/containerd-shim-cri-shim-v2)
	cp "$REPO/deploy/config.toml" "$REPO/deploy/crictl.yaml" "$REPO/deploy/kubelet/20-cri-shim.conf" "$REPO/LICENSE" "$stage/"
	# The package installs the runtime shim as /usr/bin/containerd-shim-cri-shim-v2.
	sed 's#/usr/local/bin/containerd-shim-cri-shim-v2#/usr/bin/containerd-shim-cri-shim-v2#' \
		"$REPO/deploy/containerd/50-cri-shim.toml" >"$stage/50-cri-shim.toml"
	cp "$REPO"/docs/*.md "$REPO/README.md" "$REPO/CHANGELOG.md" "$stage/docs/"
	# The package installs the binary as /usr/bin/cri-shim.
	sed 's#/usr/local/bin/cri-shim#/usr/bin/cri-shim#; s#file:///usr/local/share/doc/cri-shim/#file:///usr/share/doc/cri-shim/#' \
		"$REPO/deploy/cri-shim.service" >"$stage/cri-shim.service"
	cat >"$stage/postinstall.sh" <<'SH'
#!/bin/sh
# Reload units; the shim is not started or enabled here: an operator points
# the kubelet at it deliberately (/usr/share/cri-shim/kubelet, docs/operations.md).
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SH
	# The tarball: what deploy/install.sh installs, as it expects it.
	tarroot=$OUT/.tar-$arch/cri-shim-$VERSION-linux-$arch
	rm -rf "$OUT/.tar-$arch"
	mkdir -p "$tarroot/_output" "$tarroot/docs"
	cp "$stage/cri-shim" "$stage/containerd-shim-cri-shim-v2" "$tarroot/_output/"
	cp -r "$REPO/deploy" "$tarroot/deploy"
	cp "$REPO"/docs/*.md "$tarroot/docs/"
	cp "$REPO/README.md" "$REPO/CHANGELOG.md" "$REPO/LICENSE" "$tarroot/"
	tar -C "$OUT/.tar-$arch" --owner=0 --group=0 --numeric-owner --sort=name \
		--mtime="@$(cd "$REPO" && git log -1 --format=%ct 2>/dev/null || echo 0)" \
		-czf "$OUT/cri-shim-$VERSION-linux-$arch.tar.gz" "cri-shim-$VERSION-linux-$arch"
	rm -rf "$OUT/.tar-$arch"
	# nfpm expands variables in some fields only: fill the template here.
	sed -e "s#\${STAGE}#$stage#g" -e "s#\${VERSION}#$VERSION#g" -e "s#\${ARCH}#$arch#g" \
		"$REPO/build/nfpm.yaml" >"$stage/nfpm.yaml"
	"$NFPM" package --config "$stage/nfpm.yaml" --packager deb --target "$OUT/" >/dev/null
	rm -rf "$stage"
done
(cd "$OUT" && rm -f SHA256SUMS && sha256sum -- *.tar.gz *.deb >SHA256SUMS)
log "artifacts in $OUT:"
(cd "$OUT" && ls -l -- *.tar.gz *.deb SHA256SUMS) >&2
