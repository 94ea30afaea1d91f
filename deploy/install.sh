#!/usr/bin/env bash
# Installs cri-shim on a node: binary, config (kept if present), systemd units
# (cri-shim.socket holds the CRI socket, cri-shim.service serves it),
# its containerd runtime shim, optionally the containerd drop-in that makes it
# the pods' runtime (needed for restores), the kubelet drop-in and crictl config.
#   deploy/install.sh [--binary PATH] [--runtime-shim PATH] [--with-containerd] [--with-kubelet] [--with-crictl] [--root DIR] [--no-start]
#   deploy/install.sh --rollback
# --root installs into DIR instead of / (packaging, tests) and never calls systemctl.
# On a node where cri-shim runs, installing is an upgrade in place: the old
# binary is kept as cri-shim.previous, the new one is exec'd in the running
# process (systemctl reload: calls in flight finish, the socket stays open),
# and if it does not answer on the socket within 30 s the previous binary is
# put back. --rollback puts cri-shim.previous back the same way.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BINARY=$HERE/../_output/cri-shim
RUNTIME_SHIM=
ROOT=
CONTAINERD=
KUBELET=
CRICTL=
START=1
ROLLBACK=
while (($#)); do
	case $1 in
	--binary) BINARY=$2; shift ;;
	--runtime-shim) RUNTIME_SHIM=$2; shift ;;
	--with-containerd) CONTAINERD=1 ;;
	--root) ROOT=$2; START=; shift ;;
	--with-kubelet) KUBELET=1 ;;
	--with-crictl) CRICTL=1 ;;
	--no-start) START= ;;
	--rollback) ROLLBACK=1 ;;
	*) echo "install.sh: unknown flag $1" >&2; exit 2 ;;
	esac
	shift
done
BIN=$ROOT/usr/local/bin/cri-shim
running() { [[ -z $ROOT ]] && command -v systemctl >/dev/null && [[ -d /run/systemd/system ]] && systemctl -q is-active cri-shim.service; }
# answering waits up to 30 s for the shim to answer on its socket.
answering() {
	for _ in $(seq 30); do
		"$BIN" pods -o json >/dev/null 2>&1 && return 0
		sleep 1
	done
	return 1
}
# swap_in replaces the binary atomically (a rename: the running process keeps
# its old inode) and upgrades the running shim in place; on failure the binary
# that ran before goes back.
swap_in() {
	install -m 0755 "$1" "$BIN.new"
	mv -f "$BIN.new" "$BIN"
	running || return 0
	systemctl reload cri-shim.service
	if ! answering; then
		echo "install.sh: the new cri-shim does not answer on its socket; rolling back" >&2
		install -m 0755 "$BIN.previous" "$BIN.new" && mv -f "$BIN.new" "$BIN"
		systemctl restart cri-shim.service
		answering || echo "install.sh: the previous cri-shim does not answer either: see journalctl -u cri-shim" >&2
		return 1
	fi
}
if [[ -n $ROLLBACK ]]; then
	[[ -x $BIN.previous ]] || { echo "install.sh: no $BIN.previous to roll back to" >&2; exit 1; }
	cp -p "$BIN" "$BIN.rolledback"
	install -m 0755 "$BIN.previous" "$BIN.new" && mv -f "$BIN.new" "$BIN"
	if running; then systemctl reload cri-shim.service; answering || { echo "install.sh: cri-shim does not answer after the rollback" >&2; exit 1; }; fi
	echo "rolled back to $("$BIN" version | head -n 1)"
	exit 0
fi
[[ -x $BINARY ]] || { echo "install.sh: no binary at $BINARY (make build)" >&2; exit 1; }
RUNTIME_SHIM=${RUNTIME_SHIM:-$(dirname "$BINARY")/containerd-shim-cri-shim-v2}
[[ -x $RUNTIME_SHIM ]] || { echo "install.sh: no runtime shim at $RUNTIME_SHIM (make build)" >&2; exit 1; }

install -d -m 0755 "$ROOT/usr/local/bin" "$ROOT/etc/cri-shim"
UPGRADE=
if [[ -x $BIN ]]; then
	cp -p "$BIN" "$BIN.previous"
	UPGRADE=1
fi
if [[ -e $ROOT/etc/cri-shim/config.toml ]]; then
	echo "keeping existing $ROOT/etc/cri-shim/config.toml"
else
	install -m 0644 "$HERE/config.toml" "$ROOT/etc/cri-shim/config.toml"
fi
"$BINARY" config check --config "$ROOT/etc/cri-shim/config.toml"
# The runtime shim: a rename, so that running shims keep the binary they run.
install -m 0755 "$RUNTIME_SHIM" "$ROOT/usr/local/bin/containerd-shim-cri-shim-v2.new"
mv -f "$ROOT/usr/local/bin/containerd-shim-cri-shim-v2.new" "$ROOT/usr/local/bin/containerd-shim-cri-shim-v2"
if [[ -n $CONTAINERD ]]; then
	install -D -m 0644 "$HERE/containerd/50-cri-shim.toml" "$ROOT/etc/containerd/conf.d/50-cri-shim.toml"
	# containerd reads the drop-in only if its config imports conf.d (its
	# default config does; a config without an imports line does not).
	cfg=$ROOT/etc/containerd/config.toml
	if [[ -f $cfg ]] && ! grep -Eq "^[[:space:]]*imports[[:space:]]*=.*conf\.d" "$cfg"; then
		echo "install.sh: $cfg does not import /etc/containerd/conf.d/*.toml: add" >&2
		echo "  imports = ['/etc/containerd/conf.d/*.toml']" >&2
		echo "  at its top, or restores will not work (cri-shim doctor checks it)" >&2
	fi
fi
install -D -m 0644 "$HERE/cri-shim.socket" "$ROOT/etc/systemd/system/cri-shim.socket"
install -D -m 0644 "$HERE/cri-shim.service" "$ROOT/etc/systemd/system/cri-shim.service"
if running; then
	systemctl daemon-reload
	swap_in "$BINARY" || exit 1
	echo "upgraded in place to $("$BIN" version | head -n 1) (previous binary: $BIN.previous; deploy/install.sh --rollback)"
	exit 0
fi
install -m 0755 "$BINARY" "$BIN.new" && mv -f "$BIN.new" "$BIN"
[[ -n $UPGRADE ]] && echo "kept the binary this replaces as $BIN.previous"
install -D -m 0644 "$HERE/../docs/operations.md" "$ROOT/usr/local/share/doc/cri-shim/operations.md"
if [[ -n $KUBELET ]]; then
	install -D -m 0644 "$HERE/kubelet/20-cri-shim.conf" "$ROOT/etc/systemd/system/kubelet.service.d/20-cri-shim.conf"
	install -D -m 0644 "$HERE/kubelet/50-cri-shim.conf" "$ROOT/etc/kubernetes/kubelet.conf.d/50-cri-shim.conf"
	for f in /etc/default/kubelet /etc/sysconfig/kubelet; do
		if [[ -f $ROOT$f ]] && grep -q '^KUBELET_EXTRA_ARGS=.' "$ROOT$f"; then
			echo "WARNING: $f sets KUBELET_EXTRA_ARGS, which overrides the drop-in: add" >&2
			echo "  --config-dir=/etc/kubernetes/kubelet.conf.d" >&2
			echo "to it by hand." >&2
		fi
	done
	# Flags win over configuration files: an endpoint flag left by an older
	# kubeadm would keep the kubelet on containerd.
	for f in /var/lib/kubelet/kubeadm-flags.env /etc/default/kubelet /etc/sysconfig/kubelet; do
		if [[ -f $ROOT$f ]] && grep -q -- '--container-runtime-endpoint\|--image-service-endpoint' "$ROOT$f"; then
			echo "WARNING: $f passes --container-runtime-endpoint or --image-service-endpoint, which win over" >&2
			echo "  /etc/kubernetes/kubelet.conf.d/50-cri-shim.conf: remove them from it (kubeadm keeps the endpoint" >&2
			echo "  in the kubelet's config file since v1.27)." >&2
		fi
	done
fi
if [[ -n $CRICTL ]]; then
	install -m 0644 "$HERE/crictl.yaml" "$ROOT/etc/crictl.yaml"
fi
if [[ -n $START ]] && command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
	systemctl daemon-reload
	systemctl enable --now cri-shim.socket cri-shim.service
	if [[ -n $CONTAINERD ]]; then systemctl restart containerd.service; fi
	if [[ -n $KUBELET ]]; then systemctl restart kubelet.service; fi
	systemctl --no-pager status cri-shim.service | head -n 5
else
	echo "installed under ${ROOT:-/}; start with: systemctl daemon-reload && systemctl enable --now cri-shim.socket cri-shim.service"
fi
