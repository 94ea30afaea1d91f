#!/usr/bin/env bash
# Installs the real node stack the end-to-end tests and `make run` use:
# containerd (+ runc shim, ctr), runc, CRIU 4, CNI plugins, crictl, critest,
# checkpointctl,
# kubelet, the control plane (etcd, kube-apiserver, kubectl) and the locally
# built test images. Idempotent: each component is
# rebuilt only when its pinned inputs change (stamp files under $STACK/stamps).
# Sources: the Go module proxy and Debian packages only.
#   test/stack/install.sh [--set run|test|all] [--containerd "V..."] [--kubelet "V..."] [PART...]
# --set (default $CRI_SHIM_STACK_SET, else all): what a make target uses,
# its parts and versions (test/stack/versions.sh): run builds the newest
# pair and what make run starts, test what make test runs too, all every
# version of the matrix. --containerd and --kubelet replace the set's
# versions (each of the matrix). PART: debs testdebs containerds crictl
# critest kubelets etcd registry checkpointctl criu images (default: the
# set's, in this order).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$REPO/test/stack/versions.sh"
STACK=${CRI_SHIM_STACK:-$REPO/.stack}
BIN=$STACK/bin
TOOLS=$REPO/test/stack/tools
export GONOSUMDB=${GONOSUMDB:-k8s.io,sigs.k8s.io}
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
mkdir -p "$BIN" "$STACK/stamps" "$STACK/images"

log() { printf '[stack] %s\n' "$*" >&2; }

# stamp NAME INPUT...: true when NAME was built from exactly these inputs.
stamp_of() { cat "$@" 2>/dev/null | sha256sum | cut -d' ' -f1; }
fresh() {
	local name=$1; shift
	local want; want="$(stamp_of "$@")-$(go env GOVERSION)"
	[[ -f $STACK/stamps/$name && "$(cat "$STACK/stamps/$name")" == "$want" ]]
}
mark() {
	local name=$1; shift
	echo "$(stamp_of "$@")-$(go env GOVERSION)" > "$STACK/stamps/$name"
}

APT_UPDATED=
apt_install() {
	local missing=() p
	for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
	((${#missing[@]})) || return 0
	if [[ -z $APT_UPDATED ]]; then apt-get update -qq; APT_UPDATED=1; fi
	log "apt-get install ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# What a node of up.sh runs on (busybox-static: the images; openssl: pki.sh).
install_debs() {
	apt_install runc containernetworking-plugins busybox-static iptables iproute2 ca-certificates curl openssl
}

# What only tests run: systemd-analyze (the unit checks of test/e2e) and
# promtool (the alert rules' checks, test/e2e/monitoring_test.go).
install_testdebs() {
	apt_install systemd prometheus
}

# build_tools NAME MODULE_DIR PKG... : go build the commands of a tools module into
# OUT (default $BIN). LDFLAGS, when set, is passed to the linker.
build_tools() {
	local name=$1 dir=$2; shift 2
	local out=${OUT:-$BIN} p
	local have=1
	for p in "$@"; do [[ -x $out/$(basename "$p") && ! -L $out/$(basename "$p") ]] || have=; done
	if [[ -n $have ]] && fresh "$name" "$dir/go.mod" "$dir/go.sum" <(echo "${LDFLAGS:-}"); then return 0; fi
	log "building $name ($*)"
	local t0=$SECONDS
	mkdir -p "$out"
	(cd "$dir" && go build -tags no_btrfs -trimpath -ldflags "${LDFLAGS:-}" -o "$out/" "$@")
	mark "$name" "$dir/go.mod" "$dir/go.sum" <(echo "${LDFLAGS:-}")
	log "built $name in $((SECONDS - t0))s"
}

# The version matrix (test/stack/versions.sh): the containerds and kubelets
# selected (CONTAINERDS, KUBELETS: the set's or --containerd/--kubelet) are
# built into $STACK/versions/<name>-<version>/, and up.sh links the
# pair a node runs (CRI_SHIM_CONTAINERD_VERSION, CRI_SHIM_KUBELET_VERSION;
# default the newest, env.sh) into its bin directory. The control plane
# (kube-apiserver, kubectl) is the newest Kubernetes, which serves every
# kubelet here (the API server supports kubelets up to three minors older),
# built whatever kubelets are selected. Each kubelet minor has its tools
# module, test/stack/tools/kubelet-<minor>.
build_containerds() {
	local v
	for v in "${CONTAINERDS[@]}"; do
		OUT=$STACK/versions/containerd-$v build_tools "containerd-$v" "$TOOLS/containerd-${v%.*}" \
			github.com/containerd/containerd/v2/cmd/containerd \
			github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr
	done
}
build_kubelets() {
	local v dir newest=$KUBELET_NEWEST
	for v in "${KUBELETS[@]}"; do
		dir=$TOOLS/kubelet-${v%.*}
		K8S_VERSION=v$v LDFLAGS=$(K8S_VERSION=v$v k8s_ldflags) OUT=$STACK/versions/kubernetes-$v \
			build_tools "kubelet-$v" "$dir" k8s.io/kubernetes/cmd/kubelet
	done
	LDFLAGS=$(K8S_VERSION=v$newest k8s_ldflags) build_tools control-plane "$TOOLS/kubelet-${newest%.*}" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
}

# The control plane of the API tests: etcd (its main package is the module
# go.etcd.io/etcd/server/v3, whose binary go would call "v3"), kube-apiserver
# and kubectl from the same module as the kubelet.
build_etcd() {
	local dir=$TOOLS/etcd
	if [[ -x $BIN/etcd ]] && fresh etcd "$dir/go.mod" "$dir/go.sum"; then return 0; fi
	log "building etcd"
	local t0=$SECONDS
	(cd "$dir" && CGO_ENABLED=0 go build -trimpath -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
	mark etcd "$dir/go.mod" "$dir/go.sum"
	log "built etcd in $((SECONDS - t0))s"
}

# Kubernetes binaries report v0.0.0-master unless told their version (K8S_VERSION).
k8s_ldflags() {
	local v=k8s.io/component-base/version minor
	minor=$(echo "$K8S_VERSION" | cut -d. -f2)
	echo "-X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
}

build_critest() {
	local dir=$TOOLS/critools
	if fresh critest "$dir/go.mod" "$dir/go.sum" && [[ -x $BIN/critest ]]; then return 0; fi
	log "building critest"
	(cd "$dir" && go test -c -trimpath -o "$BIN/critest" sigs.k8s.io/cri-tools/cmd/critest)
	mark critest "$dir/go.mod" "$dir/go.sum"
}

# CRIU: bookworm's 3.17 fails `criu check` on this kernel (vDSO layout).
# trixie's 4.1.1 passes the check, but on kernel 6.18.44 its dump of any
# process (a plain `sleep` too) hangs for good in the parasite's cure
# ("Waiting for N to trap"); sid's 4.2.1 dumps. Each suite's CRIU needs a
# newer glibc than the system's: its packages are unpacked into a private
# prefix and run through that prefix's dynamic loader, leaving the system
# alone. The mirror is the one this machine's apt already uses, with the
# suite swapped. The first suite whose CRIU dumps a live process here is
# kept, and a cached CRIU that no longer dumps (a new kernel) is replaced.
CRIU_SUITES=(trixie sid)
CRIU_DEBS=(criu libc6 libgnutls30t64 libnftables1 libcompel1 libnettle8t64 libhogweed6t64 libunistring5
	libidn2-0 libp11-kit0 libtasn1-6 libgmp10 libnftnl11 libxtables12 libjansson4 libmnl0 libffi8 libbsd0
	libmd0 libprotobuf-c1 libnl-3-200 libuuid1)
declare -A CRIU_LIBNET=([trixie]=libnet1 [sid]=libnet9)

# criu_dumps CRIU: whether CRIU dumps a live process (left running) within
# 20 s on this kernel.
criu_dumps() {
	local dir pid ok=1
	dir=$(mktemp -d)
	setsid sleep 600 </dev/null >/dev/null 2>&1 &
	pid=$!
	sleep 0.2
	if timeout 20 "$1" dump -t "$pid" -D "$dir" --leave-running -o "$dir/dump.log" >/dev/null 2>&1; then ok=0; fi
	kill -9 "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	rm -rf "$dir"
	return $ok
}

install_criu() {
	if [[ -x $BIN/criu && -f $STACK/stamps/criu ]] && "$BIN/criu" --version >/dev/null 2>&1 && criu_dumps "$BIN/criu"; then return 0; fi
	local suite
	for suite in "${CRIU_SUITES[@]}"; do
		install_criu_from "$suite" || continue
		if criu_dumps "$BIN/criu"; then
			touch "$STACK/stamps/criu"
			return 0
		fi
		log "CRIU from $suite ($("$BIN/criu" --version | head -n1)) does not dump a process on kernel $(uname -r); trying the next suite"
	done
	rm -f "$STACK/stamps/criu"
	log "no CRIU of ${CRIU_SUITES[*]} dumps a process on kernel $(uname -r): checkpoints cannot work on this machine"
	return 1
}

# install_criu_from SUITE: CRIU and its libraries from Debian SUITE.
install_criu_from() {
	local suite=$1 prefix=$STACK/criu
	log "installing CRIU 4 from Debian $suite into $prefix"
	local mirror
	mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
	if [[ -z $mirror ]]; then
		mirror=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null || true)
	fi
	[[ -n $mirror ]] || { log "no Debian mirror found in this machine's apt sources"; return 1; }
	local apt=$STACK/criu-apt
	rm -rf "$apt" "$prefix"
	mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs" "$prefix"
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" > "$apt/sources.list"
	local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
		-o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "APT::Get::List-Cleanup=0")
	apt-get "${opts[@]}" update -qq || return 1
	(cd "$apt/debs" && apt-get "${opts[@]}" download "${CRIU_DEBS[@]}" "${CRIU_LIBNET[$suite]}" >/dev/null) || return 1
	for d in "$apt"/debs/*.deb; do dpkg-deb -x "$d" "$prefix"; done
	local ld
	ld=$(find "$prefix" -name 'ld-linux-x86-64.so.2' | head -n1)
	[[ -n $ld ]] || { log "CRIU prefix has no dynamic loader"; return 1; }
	cat > "$BIN/criu" <<EOF
#!/bin/sh
# CRIU from Debian $suite, run with its own glibc (installed by test/stack/install.sh).
exec "$ld" --library-path "$prefix/usr/lib/x86_64-linux-gnu:$prefix/lib/x86_64-linux-gnu" "$prefix/usr/sbin/criu" "\$@"
EOF
	chmod +x "$BIN/criu"
	"$BIN/criu" --version
}

build_images() {
	local inputs=("$REPO/test/stack/mkimage/main.go" "$REPO/test/stack/pause/main.go" /bin/busybox)
	if fresh images "${inputs[@]}" && [[ -f $STACK/images/busybox.tar && -f $STACK/images/pause.tar ]]; then return 0; fi
	log "building test images"
	(cd "$REPO" && CGO_ENABLED=0 go build -trimpath -o "$STACK/images/pause" ./test/stack/pause &&
		go build -o "$STACK/images/mkimage" ./test/stack/mkimage)
	"$STACK/images/mkimage" --name localhost/cri-shim/pause:1 --file "$STACK/images/pause:/pause" \
		--entrypoint /pause --out "$STACK/images/pause.tar"
	"$STACK/images/mkimage" --name docker.io/library/busybox:cri-shim --busybox /bin/busybox \
		--cmd sh --out "$STACK/images/busybox.tar"
	mark images "${inputs[@]}"
}

PARTS=(debs testdebs containerds crictl critest kubelets etcd registry checkpointctl criu images)
# set_parts SET: the parts SET installs, in SET_PARTS.
set_parts() {
	case $1 in
	run) SET_PARTS=(debs containerds crictl kubelets etcd criu images) ;;
	*) SET_PARTS=("${PARTS[@]}") ;;
	esac
}
part() {
	case $1 in
	debs) install_debs ;;
	testdebs) install_testdebs ;;
	containerds) build_containerds ;;
	crictl) build_tools crictl "$TOOLS/critools" sigs.k8s.io/cri-tools/cmd/crictl ;;
	critest) build_critest ;;
	kubelets) build_kubelets ;;
	etcd) build_etcd ;;
	registry) build_tools registry "$TOOLS/registry" github.com/distribution/distribution/v3/cmd/registry ;;
	checkpointctl) build_tools checkpointctl "$TOOLS/checkpointctl" github.com/checkpoint-restore/checkpointctl ;;
	criu) install_criu ;;
	images) build_images ;;
	*) log "unknown part $1 (parts: ${PARTS[*]})"; exit 2 ;;
	esac
}

# in_list WORD LIST...: whether WORD is one of LIST.
in_list() {
	local w=$1; shift
	[[ " $* " == *" $w "* ]]
}

# main [--set SET] [--containerd "V..."] [--kubelet "V..."] [PART...]: the
# set's parts in order, or only the named ones (a stack in use gains a new
# version without its other parts being checked or touched).
main() {
	local set=${CRI_SHIM_STACK_SET:-all} containerds='' kubelets='' v
	while [[ ${1:-} == --* ]]; do
		case $1 in
		--set | --containerd | --kubelet) (($# > 1)) || { log "$1 wants a value"; exit 2; } ;;
		*) log "unknown flag $1"; exit 2 ;;
		esac
		case $1 in
		--set) set=$2 ;;
		--containerd) containerds=$2 ;;
		--kubelet) kubelets=$2 ;;
		esac
		shift 2
	done
	stack_set_versions "$set" || { log "unknown set $set (sets: ${STACK_SETS[*]})"; exit 2; }
	CONTAINERDS=("${SET_CONTAINERDS[@]}") KUBELETS=("${SET_KUBELETS[@]}")
	[[ -z $containerds ]] || read -ra CONTAINERDS <<<"$containerds"
	[[ -z $kubelets ]] || read -ra KUBELETS <<<"$kubelets"
	for v in "${CONTAINERDS[@]}"; do
		in_list "$v" "${CONTAINERD_VERSIONS[@]}" || { log "containerd $v is not in the matrix (${CONTAINERD_VERSIONS[*]}; test/stack/versions.sh)"; exit 2; }
	done
	for v in "${KUBELETS[@]}"; do
		in_list "$v" "${KUBELET_VERSIONS[@]}" || { log "kubelet $v is not in the matrix (${KUBELET_VERSIONS[*]}; test/stack/versions.sh)"; exit 2; }
	done
	command -v go >/dev/null || { log "go is required"; exit 1; }
	[[ $(id -u) == 0 ]] || { log "must run as root (apt, containerd)"; exit 1; }
	local t0=$SECONDS t1 name times=''
	set_parts "$set"
	(($#)) || set -- "${SET_PARTS[@]}"
	log "set $set: containerd ${CONTAINERDS[*]}, kubelet ${KUBELETS[*]}; parts $*"
	for name in "$@"; do
		t1=$SECONDS
		part "$name"
		times+="${times:+, }$name $((SECONDS - t1))s"
	done
	log "stack ready in $STACK ($((SECONDS - t0))s: $times)"
}

main "$@"
