#!/usr/bin/env bash
# Builds the release artifacts into OUT (default _output/release):
#   cri-shim-VERSION-linux-ARCH.tar.gz  static binary, deploy files, docs, LICENSE
#   cri-shim_VERSION_ARCH.deb           Debian package (build/deb.sh)
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

for arch in "${ARCHES[@]}"; do
	bin=$OUT/.bin-$arch
	rm -rf "$bin"
	mkdir -p "$bin"
	log "building cri-shim $VERSION for linux/$arch"
	(cd "$REPO" && CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath \
		-ldflags "-X github.com/cri-shim/cri-shim/internal/version.Version=$VERSION -X github.com/cri-shim/cri-shim/internal/version.Revision=$(git rev-parse HEAD) -X github.com/cri-shim/cri-shim/internal/version.CommitTime=$(git log -1 --format=%cI)" \
		-o "$bin/cri-shim" ./cmd/cri-shim &&
		CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -o "$bin/containerd-shim-cri-shim-v2" ./cmd/containerd-shim-cri-shim-v2)
	# The tarball: what deploy/install.sh installs, as it expects it.
	tarroot=$OUT/.tar-$arch/cri-shim-$VERSION-linux-$arch
	rm -rf "$OUT/.tar-$arch"
	mkdir -p "$tarroot/_output" "$tarroot/docs"
	cp "$bin/cri-shim" "$bin/containerd-shim-cri-shim-v2" "$tarroot/_output/"
	cp -r "$REPO/deploy" "$tarroot/deploy"
	cp "$REPO"/docs/*.md "$tarroot/docs/"
	cp "$REPO/README.md" "$REPO/CHANGELOG.md" "$REPO/LICENSE" "$tarroot/"
	tar -C "$OUT/.tar-$arch" --owner=0 --group=0 --numeric-owner --sort=name \
		--mtime="@$(cd "$REPO" && git log -1 --format=%ct 2>/dev/null || echo 0)" \
		-czf "$OUT/cri-shim-$VERSION-linux-$arch.tar.gz" "cri-shim-$VERSION-linux-$arch"
	rm -rf "$OUT/.tar-$arch"
	"$REPO/build/deb.sh" "$VERSION" "$arch" "$bin" "$OUT"
	rm -rf "$bin"
done
(cd "$OUT" && rm -f SHA256SUMS && sha256sum -- *.tar.gz *.deb >SHA256SUMS)
log "artifacts in $OUT:"
(cd "$OUT" && ls -l -- *.tar.gz *.deb SHA256SUMS) >&2
