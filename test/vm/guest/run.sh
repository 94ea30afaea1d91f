#!/bin/bash
# Runs inside the guest (test/vm/run.sh boots it): sets up a node the way
# an operator's kubeadm-style node is (containerd with its stock config and
# the systemd cgroup driver, the kubelet's packaged unit and kubeadm's
# drop-in, cgroup v2), installs cri-shim with deploy/install.sh, and runs
# the suite /payload/suite names: "node" (the features on it: checks.sh) or
# "shapes" (containerd main-config shapes x containerd versions: shapes.sh).
# Each check appends "PASS name" or "FAIL name: why" to
# /payload/out/results; the exit status is 0 only if every check passed.
set -uo pipefail
P=/payload
OUT=$P/out
exec > >(tee -a "$OUT/guest.log") 2>&1
SHIM_SOCK=unix:///run/cri-shim/cri-shim.sock
failed=0
pass() { echo "PASS $1" | tee -a "$OUT/results"; }
fail() { echo "FAIL $1: $2" | tee -a "$OUT/results"; failed=1; }
# wait_for SECONDS WHAT CMD...: polls CMD once a second.
wait_for() {
	local n=$1 what=$2; shift 2
	for ((i = 0; i < n; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
	echo "timed out after ${n}s waiting for $what" >&2
	return 1
}
crictl_shim() { crictl --runtime-endpoint "$SHIM_SOCK" --image-endpoint "$SHIM_SOCK" "$@"; }
SUITE=$(cat "$P/suite" 2>/dev/null || echo node)
t0=$(cut -d. -f1 /proc/uptime)
echo "=== guest up at ${t0}s: $(uname -r), $(stat -fc %T /sys/fs/cgroup), systemd $(systemctl --version | head -n1 | cut -d' ' -f2)"

# --- The node as an operator has it before cri-shim -------------------------
. "$P/guest/node.sh"
. "$P/guest/checks.sh"
trap 'fail node-setup "$BASH_COMMAND failed"; exit 1' ERR
set -eE
node_setup
set +eE
trap - ERR
echo "=== node up at $(cut -d. -f1 /proc/uptime)s: $(node_versions)"
[[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]] && pass cgroup-v2 || fail cgroup-v2 "/sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup)"

# --- Install, as the operations guide says ----------------------------------
containerd config dump >"$OUT/containerd-before.toml" 2>/dev/null
find /etc -xdev -type f -o -type l | sort | xargs -d '\n' sha256sum 2>/dev/null >"$OUT/etc-before.sha"
"$P/repo/deploy/install.sh" --binary "$P/repo/_output/cri-shim" --with-containerd --with-kubelet --with-crictl \
	>"$OUT/install.log" 2>&1 && pass install || fail install "exit $? (install.log)"
containerd config dump >"$OUT/containerd-after.toml" 2>/dev/null
config_only_runtime_path "$OUT/containerd-before.toml" "$OUT/containerd-after.toml" &&
	pass containerd-config-only-runtime-path || fail containerd-config-only-runtime-path "$CHECK_WHY"

case $SUITE in
node)
	check_socket_activated
	check_kubelet_on_shim
	check_inplace_restart
	check_backoff_curve
	check_checkpoint_restore
	check_upgrade_under_crash_loop
	check_uninstall
	;;
shapes)
	. "$P/guest/shapes.sh"
	check_kubelet_on_shim
	check_shapes
	;;
*) fail suite "no suite $SUITE" ;;
esac
echo "=== guest checks done at $(cut -d. -f1 /proc/uptime)s"
journalctl -u cri-shim --no-pager >"$OUT/cri-shim.journal" 2>&1
journalctl -u kubelet --no-pager | tail -n 400 >"$OUT/kubelet.journal" 2>&1
journalctl -u containerd --no-pager | tail -n 400 >"$OUT/containerd.journal" 2>&1
exit $failed
