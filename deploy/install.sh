#!/usr/bin/env bash
# Installs cri-shim on a node: binary, config (kept if present), systemd units
# (cri-shim.socket holds the CRI socket, cri-shim.service serves it), its
# containerd runtime shim, optionally the containerd drop-in that makes it the
# pods' runtime (needed for restores), the kubelet drop-ins and crictl config.
#   deploy/install.sh [--binary PATH] [--runtime-shim PATH] [--with-containerd] [--with-kubelet] [--with-crictl]
#                     [--containerd-bin PATH] [--containerd-config PATH] [--root DIR] [--no-start] [--dry-run]
#   deploy/install.sh --rollback      back to the binary an upgrade replaced (cri-shim.previous)
#   deploy/install.sh --uninstall     remove everything install.sh placed, putting back what it replaced
#   /usr/share/cri-shim/install.sh [--with-*] [--containerd-*] [--root DIR] [--no-start] [--dry-run] [--uninstall]
#                                     the .deb's copy, in packaged mode (below)
# Every run converges to what it is asked for: a second run with more --with-*
# flags adds those steps, an unchanged run changes nothing and restarts
# nothing. What install.sh placed is recorded in /var/lib/cri-shim-install
# (files it replaced are kept there), which --uninstall reads.
# --root installs into DIR instead of / (packaging, tests) and never calls
# systemctl. --dry-run says what would change (with containerd's config diff)
# and changes nothing.
# On a node where cri-shim runs, a new binary is an upgrade in place: the old
# binary is kept as cri-shim.previous, the new one is exec'd in the running
# process (systemctl reload: calls in flight finish, the socket stays open),
# and unless the process runs the new binary and answers on the socket within
# 30 s the previous binary is put back. docs/operations.md has the details.
#
# Packaged mode (--packaged; the default when this file runs as the .deb's
# /usr/share/cri-shim/install.sh): the cri-shim package owns the binaries
# (/usr/bin), the units (/lib/systemd/system) and /etc/cri-shim/config.toml,
# so install.sh places none of them and only does the node steps above, the
# containerd drop-in naming /usr/bin/containerd-shim-cri-shim-v2, and enables
# the units; --uninstall undoes those steps only. Upgrades and rollbacks of
# the binary are apt's: --binary, --runtime-shim and --rollback are refused.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BINARY=$HERE/../_output/cri-shim
PACKAGED=
[[ $HERE != */usr/share/cri-shim ]] || PACKAGED=1
OWN_BINARY=
RUNTIME_SHIM=
ROOT=
CONTAINERD=
KUBELET=
CRICTL=
START=1
MODE=install
DRY=
CTRD_BIN=
CTRD_MAIN=/etc/containerd/config.toml
while (($#)); do
	case $1 in
	--binary) BINARY=$2; OWN_BINARY=$1; shift ;;
	--runtime-shim) RUNTIME_SHIM=$2; OWN_BINARY=$1; shift ;;
	--packaged) PACKAGED=1 ;;
	--with-containerd) CONTAINERD=1 ;;
	--containerd-bin) CTRD_BIN=$2; shift ;;
	--containerd-config) CTRD_MAIN=$2; shift ;;
	--root) ROOT=$(cd "$2" && pwd); START=; shift ;;
	--with-kubelet) KUBELET=1 ;;
	--with-crictl) CRICTL=1 ;;
	--no-start) START= ;;
	--dry-run) DRY=1 ;;
	--rollback) MODE=rollback ;;
	--uninstall) MODE=uninstall ;;
	*) echo "install.sh: unknown flag $1" >&2; exit 2 ;;
	esac
	shift
done
[[ $CTRD_MAIN == /* ]] || { echo "install.sh: --containerd-config $CTRD_MAIN: want an absolute path (as on the node)" >&2; exit 2; }
[[ $ROOT == / ]] && ROOT=
if [[ -n $PACKAGED && -n $OWN_BINARY ]]; then
	echo "install.sh: $OWN_BINARY: on a packaged node the binaries are the cri-shim package's (/usr/bin): install another version with apt" >&2
	exit 2
fi
if [[ -n $PACKAGED && $MODE == rollback ]]; then
	echo "install.sh: --rollback: on a packaged node apt owns the binary: go back with apt install cri-shim=VERSION (apt list -a cri-shim); --uninstall undoes the node steps" >&2
	exit 2
fi
# BIN_DIR: where the binaries are on the node (the package's, or install.sh's own).
BIN_DIR=/usr/local/bin
[[ -z $PACKAGED ]] || BIN_DIR=/usr/bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# shellcheck source=deploy/lib/files.sh
. "$HERE/lib/files.sh"
# shellcheck source=deploy/lib/containerd.sh
. "$HERE/lib/containerd.sh"
# shellcheck source=deploy/lib/kubelet.sh
. "$HERE/lib/kubelet.sh"

BIN=$ROOT$BIN_DIR/cri-shim
live() { [[ -z $ROOT ]] && command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; }
running() { live && systemctl -q is-active cri-shim.service; }
# sys runs systemctl on a live node (printing it with --dry-run).
sys() {
	if [[ -n $DRY ]]; then echo "would run: systemctl $*"; return 0; fi
	systemctl "$@"
}
# serving_new waits up to 30 s for cri-shim.service's process to run the
# binary now at $BIN (after an in-place upgrade the PID stays and its
# executable becomes the new file; until the exec, it is the replaced,
# deleted one) and then to answer on its socket: an answer before the exec
# would come from the old binary.
serving_new() {
	local pid
	for _ in $(seq 30); do
		pid=$(systemctl show -p MainPID --value cri-shim.service 2>/dev/null || echo 0)
		if [[ $pid != 0 && /proc/$pid/exe -ef $BIN ]] && "$BIN" pods -o json >/dev/null 2>&1; then
			return 0
		fi
		sleep 1
	done
	return 1
}
# swap_in SRC: replaces the binary atomically (a rename: the running process
# keeps its old inode) and upgrades the running shim in place; on failure the
# binary that ran before goes back.
swap_in() {
	place "$1" /usr/local/bin/cri-shim 0755 ours || return 0
	running || return 0
	sys reload cri-shim.service
	[[ -n $DRY ]] && return 0
	if ! serving_new; then
		echo "install.sh: cri-shim.service does not run the new binary and answer on its socket within 30 s; rolling back" >&2
		install -m 0755 "$BIN.previous" "$BIN.new" && mv -f "$BIN.new" "$BIN"
		systemctl restart cri-shim.service
		serving_new || echo "install.sh: the previous cri-shim does not answer either: see journalctl -u cri-shim" >&2
		return 1
	fi
	echo "upgraded in place to $("$BIN" version | head -n 1) (previous binary: /usr/local/bin/cri-shim.previous; deploy/install.sh --rollback)"
}

rollback() {
	[[ -x $BIN.previous ]] || { echo "install.sh: no $BIN.previous to roll back to" >&2; exit 1; }
	cp -p "$BIN" "$TMP/rolledback"
	place "$TMP/rolledback" /usr/local/bin/cri-shim.rolledback 0755 ours || true
	swap_in "$BIN.previous" || exit 1
	echo "rolled back to $("$BIN" version | head -n 1)"
}

# uninstall: the kubelet back on containerd first (it must not point at a
# socket nobody serves), then the shim stopped and disabled, containerd's
# files put back and containerd restarted, then everything else.
uninstall() {
	[[ -f $MANIFEST ]] || { echo "install.sh: nothing recorded in ${MANIFEST#"$ROOT"}: nothing to uninstall"; return 0; }
	local kubelet ctrd path
	kubelet=$(placed '^(/etc/systemd/system/kubelet\.service\.d/|.*/50-cri-shim\.conf$)')
	ctrd=$(placed '^/etc/containerd/|^'"$CTRD_MAIN"'$')
	for path in $kubelet; do unplace "$path"; done
	if live; then
		sys daemon-reload
		[[ -z $kubelet ]] || sys restart kubelet.service
		sys disable --now cri-shim.socket cri-shim.service
	fi
	for path in $ctrd; do unplace "$path"; done
	if live && [[ -n $ctrd ]]; then sys restart containerd.service; fi
	# Containers whose sandbox started under the runtime shim keep running it
	# until they are recreated: its binary stays while a process runs it.
	if live && [[ -z $DRY ]] && recorded "f $RUNTIME_SHIM_PATH"; then
		for path in /proc/[0-9]*/exe; do
			if [[ $path -ef $RUNTIME_SHIM_PATH ]]; then
				echo "keeping $RUNTIME_SHIM_PATH: containers still run under it (remove it once their pods are recreated)"
				forget "f $RUNTIME_SHIM_PATH"
				break
			fi
		done
	fi
	unplace_all
	if live; then sys daemon-reload; fi
	[[ -n $DRY ]] || echo "uninstalled cri-shim from ${ROOT:-/} (the shim's own records in /var/lib/cri-shim are kept)"
}

# A packaged node's record must be its own: a tarball install's record names
# files (units in /etc/systemd/system, its binary) that would hide or shadow
# the package's, and its --uninstall is that install.sh's to run.
if [[ -n $PACKAGED ]] && recorded "f /usr/local/bin/cri-shim"; then
	echo "install.sh: ${MANIFEST#"$ROOT"} records a tarball install (/usr/local/bin/cri-shim): undo it with its deploy/install.sh --uninstall first" >&2
	exit 1
fi

case $MODE in
rollback) rollback; exit 0 ;;
uninstall) uninstall; exit 0 ;;
esac

if [[ -n $PACKAGED ]]; then
	for f in "$BIN" "$ROOT$RUNTIME_SHIM_PATH" "$ROOT/lib/systemd/system/cri-shim.socket" "$ROOT/lib/systemd/system/cri-shim.service"; do
		[[ -e $f ]] || { echo "install.sh: packaged mode: no ${f#"$ROOT"} under ${ROOT:-/}: install the cri-shim package first" >&2; exit 1; }
	done
	BINARY=$BIN
else
	[[ -x $BINARY ]] || { echo "install.sh: no binary at $BINARY (make build)" >&2; exit 1; }
	RUNTIME_SHIM=${RUNTIME_SHIM:-$(dirname "$BINARY")/containerd-shim-cri-shim-v2}
	[[ -x $RUNTIME_SHIM ]] || { echo "install.sh: no runtime shim at $RUNTIME_SHIM (make build)" >&2; exit 1; }
fi
if [[ -n $CONTAINERD ]]; then
	CTRD_BIN=${CTRD_BIN:-$(command -v containerd || true)}
	[[ -n $CTRD_BIN && -x $CTRD_BIN ]] || { echo "install.sh: --with-containerd checks the merged config with containerd's own binary: none on PATH (--containerd-bin PATH)" >&2; exit 1; }
fi

# Plan everything that can refuse before changing anything.
if [[ -n $CONTAINERD ]]; then ctrd_plan || exit 1; fi
if [[ -n $KUBELET ]]; then kl_plan || exit 1; fi

# The config: on a packaged node, the package's conffile.
CFG=$ROOT/etc/cri-shim/config.toml
if [[ -z $PACKAGED ]]; then
	if [[ -e $CFG ]] && ! recorded "f /etc/cri-shim/config.toml"; then
		echo "keeping existing /etc/cri-shim/config.toml"
	else
		place "$HERE/config.toml" /etc/cri-shim/config.toml 0644 || true
	fi
	[[ -e $CFG ]] || CFG=$HERE/config.toml # a dry run placed nothing
fi
"$BINARY" config check --config "$CFG"
UNITS=
if [[ -z $PACKAGED ]]; then
	# The runtime shim: a rename, so that running shims keep the binary they run.
	place "$RUNTIME_SHIM" "$RUNTIME_SHIM_PATH" 0755 ours || true
	place "$HERE/cri-shim.socket" /etc/systemd/system/cri-shim.socket 0644 ours && UNITS=1
	place "$HERE/cri-shim.service" /etc/systemd/system/cri-shim.service 0644 ours && UNITS=1
	place "$HERE/../docs/operations.md" /usr/local/share/doc/cri-shim/operations.md 0644 ours || true
fi
if [[ -n $CONTAINERD ]]; then ctrd_apply || exit 1; fi
KUBELET_CHANGED=
if [[ -n $KUBELET ]]; then
	place "$TMP/20-cri-shim.conf" "$KL_DROPIN" 0644 ours && KUBELET_CHANGED=1
	place "$HERE/kubelet/50-cri-shim.conf" "$KL_DIR/50-cri-shim.conf" 0644 ours && KUBELET_CHANGED=1
	[[ -n $DRY ]] || kl_verify || exit 1
	kl_flag_warnings
fi
if [[ -n $CRICTL ]]; then place "$HERE/crictl.yaml" /etc/crictl.yaml 0644 || true; fi

# The binary last: on a node where the shim runs this is the upgrade (on a
# packaged node, apt's).
if [[ -z $PACKAGED ]]; then
	if [[ -x $BIN ]] && ! cmp -s "$BINARY" "$BIN"; then
		if [[ -z $DRY ]]; then cp -p "$BIN" "$TMP/previous"; fi
		[[ -n $DRY ]] || place "$TMP/previous" /usr/local/bin/cri-shim.previous 0755 ours || true
		[[ -n $DRY ]] || echo "kept the binary this replaces as /usr/local/bin/cri-shim.previous"
	fi
	if running; then
		[[ -z $UNITS ]] || sys daemon-reload
		swap_in "$BINARY" || exit 1
	else
		place "$BINARY" /usr/local/bin/cri-shim 0755 ours || true
	fi
fi

if [[ -n $START ]] && live; then
	sys daemon-reload
	sys enable --now cri-shim.socket cri-shim.service
	if [[ -n ${CTRD_CHANGED:-} ]]; then sys restart containerd.service; fi
	if [[ -n $KUBELET_CHANGED ]]; then sys restart kubelet.service; fi
	[[ -n $DRY ]] || systemctl --no-pager status cri-shim.service | head -n 5
elif [[ -n $DRY ]]; then
	echo "dry run: nothing changed"
else
	echo "installed under ${ROOT:-/}; start with: systemctl daemon-reload && systemctl enable --now cri-shim.socket cri-shim.service"
	[[ -z ${CTRD_CHANGED:-} ]] || echo "then: systemctl restart containerd.service (its effective config changed in the runc handler's runtime_path)"
	[[ -z $KUBELET_CHANGED ]] || echo "then: systemctl daemon-reload && systemctl restart kubelet.service"
fi
