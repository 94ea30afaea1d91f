#!/usr/bin/env bash
# Builds the systemd + cgroup v2 guest the long tier's node tests boot
# (docs/testing.md, "A real node in a guest"): a Debian bookworm root from
# Debian's packages (debootstrap), its own kernel and initrd, and runc 1.4
# from the Go module proxy (bookworm's runc 1.1.5 leaves CRIU the image's
# own cgroup path on a cgroup v2 restore). Cached under $CRI_SHIM_STACK/vm
# and rebuilt only when its inputs change.
#   test/vm/build.sh
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STACK=${CRI_SHIM_STACK:-$REPO/.stack}
VM=$STACK/vm
MIRROR=${CRI_SHIM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PKGS=systemd,systemd-sysv,udev,linux-image-amd64,iproute2,iptables,kmod,ca-certificates,containernetworking-plugins,libseccomp2,procps,e2fsprogs,dbus
export PATH=/usr/local/go/bin:$PATH GONOSUMDB=${GONOSUMDB:-k8s.io,sigs.k8s.io} GOFLAGS="${GOFLAGS:-} -mod=readonly"
log() { printf '[vm] %s\n' "$*" >&2; }
mkdir -p "$VM"

missing=()
for p in qemu-system-x86 debootstrap e2fsprogs libseccomp-dev pkg-config; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	log "apt-get install ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The root: packages, then what makes it a test node (customize).
want="bookworm $PKGS $(sha256sum "$REPO/test/vm/customize.sh" | cut -d' ' -f1)"
if [[ ! -f $VM/base.img || "$(cat "$VM/base.stamp" 2>/dev/null)" != "$want" ]]; then
	if [[ ! -d $VM/base || "$(cat "$VM/debootstrap.stamp" 2>/dev/null)" != "bookworm $PKGS" ]]; then
		rm -rf "$VM/base" "$VM/base.tmp"
		log "debootstrap bookworm (about 2 minutes)"
		debootstrap --variant=minbase --include="$PKGS" bookworm "$VM/base.tmp" "$MIRROR" >"$VM/debootstrap.log" 2>&1 ||
			{ tail -n 20 "$VM/debootstrap.log" >&2; exit 1; }
		mv "$VM/base.tmp" "$VM/base"
		echo "bookworm $PKGS" >"$VM/debootstrap.stamp"
	fi
	"$REPO/test/vm/customize.sh" "$VM/base"
	cp "$(ls "$VM"/base/boot/vmlinuz-* | sort -V | tail -n1)" "$VM/vmlinuz"
	cp "$(ls "$VM"/base/boot/initrd.img-* | sort -V | tail -n1)" "$VM/initrd.img"
	rm -f "$VM/base.img"
	log "mkfs.ext4 the root image"
	mkfs.ext4 -q -F -L crishim-root -d "$VM/base" "$VM/base.img" 4G
	echo "$want" >"$VM/base.stamp"
fi

# runc for cgroup v2 restores.
rmod=$REPO/test/stack/tools/runc
want="$(cat "$rmod/go.mod" "$rmod/go.sum" | sha256sum | cut -d' ' -f1)-$(go env GOVERSION)"
if [[ ! -x $VM/runc || "$(cat "$VM/runc.stamp" 2>/dev/null)" != "$want" ]]; then
	log "building runc ($(grep -o 'opencontainers/runc v[^ ]*' "$rmod/go.mod"))"
	(cd "$rmod" && CGO_ENABLED=1 go build -tags seccomp -trimpath -o "$VM/runc" github.com/opencontainers/runc)
	echo "$want" >"$VM/runc.stamp"
fi
log "guest ready: $VM/base.img, kernel $(basename "$(ls "$VM"/base/boot/vmlinuz-* | sort -V | tail -n1)"), runc $("$VM/runc" --version | head -n1 | cut -d' ' -f3)"
