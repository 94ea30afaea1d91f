#!/usr/bin/env bash
# Boots the systemd + cgroup v2 guest (test/vm/build.sh) with this tree's
# cri-shim and the stack's containerd, kubelet and CRIU on a payload disk,
# runs test/vm/guest/run.sh inside (as an operator would set up a node and
# install cri-shim with deploy/install.sh) and copies its results out.
#   test/vm/run.sh        results: _output/vm/{console.log,out/}
#                         (the shapes suite: _output/vm-shapes)
# CRI_SHIM_VM_SUITE picks what the guest checks on that node:
#   node    (default) the features: test/vm/guest/checks.sh
#   shapes  containerd's main-config shapes (test/testdata/containerd-shapes)
#           x containerd 2.2.9, 2.3.7 and 2.4.2: test/vm/guest/shapes.sh
# CRI_SHIM_VM_CONTAINERD and CRI_SHIM_VM_KUBELET (default 2.4.2 and 1.37.2)
# pick the node's versions from $CRI_SHIM_STACK/versions; the shapes suite
# sets the node up on the oldest containerd it goes through (2.2.9), so
# that each later version upgrades the one before on the same state.
# Exits 0 when every guest check passed. CRI_SHIM_VM_TIMEOUT (seconds,
# default 1800, 3600 for shapes) bounds the guest's run (TCG: about 6x
# slower than the host).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STACK=${CRI_SHIM_STACK:-$REPO/.stack}
VM=$STACK/vm
SUITE=${CRI_SHIM_VM_SUITE:-node}
OUT=${CRI_SHIM_VM_OUT:-$REPO/_output/vm}
. "$REPO/test/stack/versions.sh"
CONTAINERD=${CRI_SHIM_VM_CONTAINERD:-$CONTAINERD_NEWEST}
KUBELET=${CRI_SHIM_VM_KUBELET:-$KUBELET_NEWEST}
SHAPE_VERSIONS=("${CONTAINERD_VERSIONS[@]}")
TIMEOUT=${CRI_SHIM_VM_TIMEOUT:-1800}
log() { printf '[vm] %s\n' "$*" >&2; }
export PATH=/usr/local/go/bin:$PATH
case $SUITE in
node) ;;
shapes)
	[[ -z ${CRI_SHIM_VM_CONTAINERD:-} ]] || { echo "run.sh: the shapes suite goes through containerd ${SHAPE_VERSIONS[*]}: CRI_SHIM_VM_CONTAINERD is for the node suite" >&2; exit 2; }
	CONTAINERD=${SHAPE_VERSIONS[0]}
	TIMEOUT=${CRI_SHIM_VM_TIMEOUT:-3600}
	OUT=${CRI_SHIM_VM_OUT:-$REPO/_output/vm-shapes}
	;;
*) echo "run.sh: CRI_SHIM_VM_SUITE=$SUITE: want node or shapes" >&2; exit 2 ;;
esac
ctrd_dir() { echo "$STACK/versions/containerd-$1"; }
missing=$(
	stack_missing "$STACK" "$CONTAINERD" "$KUBELET"
	if [[ $SUITE == shapes ]]; then for v in "${SHAPE_VERSIONS[@]}"; do stack_missing "$STACK" "$v" "$KUBELET"; done; fi
)
[[ -z $missing ]] || { sort -u <<<"$missing" | while read -r m; do echo "run.sh: $m" >&2; done; exit 1; }
"$REPO/test/vm/build.sh"
for f in "$REPO/_output/cri-shim" "$REPO/_output/containerd-shim-cri-shim-v2"; do
	[[ -x $f ]] || { echo "run.sh: no $f (make build)" >&2; exit 1; }
done

rm -rf "$OUT"
P=$OUT/payload
mkdir -p "$P/bin" "$P/images" "$P/repo/_output" "$P/repo/docs" "$P/out"
echo "$SUITE" >"$P/suite"
cp "$(ctrd_dir "$CONTAINERD")"/{containerd,containerd-shim-runc-v2,ctr} "$STACK/versions/kubernetes-$KUBELET/kubelet" \
	"$STACK/bin/crictl" "$VM/runc" "$P/bin/"
if [[ $SUITE == shapes ]]; then
	for v in "${SHAPE_VERSIONS[@]}"; do
		mkdir -p "$P/containerd/$v"
		cp "$(ctrd_dir "$v")"/{containerd,containerd-shim-runc-v2,ctr} "$P/containerd/$v/"
	done
	cp -a "$REPO/test/testdata/containerd-shapes" "$P/shapes"
fi
cp -a "$STACK/criu" "$P/criu"
cp "$STACK"/images/{busybox,pause}.tar "$P/images/"
cp -a "$REPO/deploy" "$P/repo/"
cp "$REPO/docs/operations.md" "$P/repo/docs/"
cp "$REPO/_output/cri-shim" "$REPO/_output/containerd-shim-cri-shim-v2" "$P/repo/_output/"
# The upgrade the node suite performs: the same code with another version stamp.
[[ $SUITE != node ]] || (cd "$REPO" && CGO_ENABLED=0 go build -trimpath -ldflags "-X github.com/cri-shim/cri-shim/internal/version.Version=vm-upgrade" \
	-o "$P/repo/_output/cri-shim-upgrade" ./cmd/cri-shim)
cp -a "$REPO/test/vm/guest" "$P/guest"
cp -a "$REPO/test/testdata/kubeadm" "$P/kubeadm"
size=$(( $(du -sm "$P" | cut -f1) + 512 ))
mkfs.ext4 -q -F -L payload -d "$P" "$OUT/payload.img" "${size}M"

log "booting the guest for the $SUITE suite (containerd $("$P/bin/containerd" --version | cut -d' ' -f3), kubelet $("$P/bin/kubelet" --version | cut -d' ' -f2); console: $OUT/console.log)"
t0=$SECONDS
rc=0
timeout --foreground "$TIMEOUT" qemu-system-x86_64 -machine q35 -accel tcg,thread=multi -smp 2 -m 3072 \
	-nographic -no-reboot -nic none \
	-kernel "$VM/vmlinuz" -initrd "$VM/initrd.img" \
	-append "root=/dev/vda rw console=ttyS0 quiet loglevel=3 systemd.show_status=0 panic=-1" \
	-drive "file=$VM/base.img,if=virtio,format=raw,snapshot=on" \
	-drive "file=$OUT/payload.img,if=virtio,format=raw" \
	</dev/null >"$OUT/console.log" 2>&1 || rc=$?
log "guest ended after $((SECONDS - t0))s (qemu rc $rc)"
debugfs -R "rdump /out $OUT" "$OUT/payload.img" >/dev/null 2>&1 || true
rm -rf "$P"
if [[ -f $OUT/out/results ]]; then
	echo "=== guest checks ($OUT/out/results)"
	cat "$OUT/out/results"
fi
grep -q '^vmtest: exit 0$' "$OUT/out/rc" 2>/dev/null || {
	echo "guest run failed: $(cat "$OUT/out/rc" 2>/dev/null || echo 'no exit status (timed out or did not boot)'); last console lines:"
	tail -n 40 "$OUT/console.log"
	exit 1
}
