#!/usr/bin/env bash
# Installs cri-shim on a node: binary, config (kept if present), systemd unit,
# optionally the kubelet drop-in and crictl config.
#   deploy/install.sh [--binary PATH] [--with-kubelet] [--with-crictl] [--root DIR] [--no-start]
# --root installs into DIR instead of / (packaging, tests) and never calls systemctl.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BINARY=$HERE/../_output/cri-shim
ROOT=
KUBELET=
CRICTL=
START=1
while (($#)); do
	case $1 in
	--binary) BINARY=$2; shift ;;
	--root) ROOT=$2; START=; shift ;;
	--with-kubelet) KUBELET=1 ;;
	--with-crictl) CRICTL=1 ;;
	--no-start) START= ;;
	*) echo "install.sh: unknown flag $1" >&2; exit 2 ;;
	esac
	shift
done
[[ -x $BINARY ]] || { echo "install.sh: no binary at $BINARY (make build)" >&2; exit 1; }

install -D -m 0755 "$BINARY" "$ROOT/usr/local/bin/cri-shim"
install -d -m 0755 "$ROOT/etc/cri-shim"
if [[ -e $ROOT/etc/cri-shim/config.toml ]]; then
	echo "keeping existing $ROOT/etc/cri-shim/config.toml"
else
	install -m 0644 "$HERE/config.toml" "$ROOT/etc/cri-shim/config.toml"
fi
"$ROOT/usr/local/bin/cri-shim" config check --config "$ROOT/etc/cri-shim/config.toml"
install -D -m 0644 "$HERE/cri-shim.service" "$ROOT/etc/systemd/system/cri-shim.service"
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
	systemctl enable --now cri-shim.service
	if [[ -n $KUBELET ]]; then systemctl restart kubelet.service; fi
	systemctl --no-pager status cri-shim.service | head -n 5
else
	echo "installed under ${ROOT:-/}; start with: systemctl daemon-reload && systemctl enable --now cri-shim"
fi
