#!/usr/bin/env bash
# Starts a test node: containerd, cri-shim and (with --kubelet) a standalone
# kubelet pointed at the shim, in a scratch directory on private sockets.
# Writes $NODE_RUN/env with the paths for tests and humans. Stop with down.sh.
#   up.sh [--kubelet] [--apiserver | --join] [--manifest FILE]... [--shim-config FILE] [--shim-api]
#   up.sh --start containerd|cri-shim|kubelet|kubelet-api|kubelet-api-nogate|kubelet-dropin|apiserver|router|registry|registry-tls|registry-auth
#         (re)start one component of a running node
# --apiserver also starts etcd, kube-apiserver on loopback ports and the
# PodCheckpoint router (cri-shim router), and the
# kubelet (with --kubelet) registers with it as node $NODE_NAME. --join: the
# kubelet registers with the API server another node of this machine runs
# (node2.sh: $PKI is that node's), none is started here.
# --shim-config appends FILE (TOML) to the shim's config (make run: the demo's).
# --shim-api: the shim acts as the node in the API ([kubernetes] with the
# kubelet's kubeconfig; make run).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
KUBELET=
APISERVER=
JOIN=
ONLY=
MANIFEST_FILES=()
SHIM_EXTRA=
SHIM_API=
while (($#)); do
	case $1 in
	--kubelet) KUBELET=1 ;;
	--apiserver) APISERVER=1 ;;
	--join) JOIN=1 ;;
	--manifest) MANIFEST_FILES+=("$2"); shift ;;
	--shim-config) SHIM_EXTRA=$2; shift ;;
	--shim-api) SHIM_API=1 ;;
	--start) ONLY=$2; shift ;;
	*) echo "up.sh: unknown flag $1" >&2; exit 2 ;;
	esac
	shift
done
log() { printf '[node] %s\n' "$*" >&2; }
[[ $(id -u) == 0 ]] || { log "must run as root"; exit 1; }
# The caller's go, before PATH is narrowed: registry-auth builds its
# password hasher with it.
GO=$(command -v "${GO:-go}" || true)
export PATH=$NODE_BIN:$STACK/bin:/usr/sbin:/usr/bin:/sbin:/bin

wait_for() { # wait_for SECONDS DESC CMD...
	local t=$1 what=$2; shift 2
	local deadline=$((SECONDS + t))
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || { log "timed out waiting for $what"; return 1; }
		sleep 0.1
	done
}

# spawn NAME CMD...: start a daemon in its own session, log and pid under $NODE_RUN.
spawn() {
	local name=$1; shift
	local f=$NODE_RUN/$name.pid
	if [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null; then
		log "$name already running ($(cat "$f"))"
		return 0
	fi
	log "starting $name"
	setsid "$@" >>"$NODE_RUN/$name.log" 2>&1 </dev/null &
	echo $! >"$f"
}

# The kubelet's native in-place restart (KEP-5532) and the gates it depends
# on: kubelet v1.35 has it alpha, off, and refuses to start with it on while
# ContainerRestartRules or NodeDeclaredFeatures is off (pkg/features/
# kube_features.go, its dependencies; k8s.io/component-base featuregate,
# "is enabled, but depends on features that are disabled"); v1.34 has none.
NATIVE_GATES=(RestartAllContainersOnContainerExits ContainerRestartRules NodeDeclaredFeatures)

# known_gates: the feature gates the node's kubelet has, one a line, from its
# --help. A kubelet refuses to start on a gate it does not know
# ("unrecognized feature gate"), so a config sets only these.
KNOWN_GATES=
known_gate() {
	[[ -n $KNOWN_GATES ]] || KNOWN_GATES=$("$STACK/versions/kubernetes-$KUBELET_VERSION/kubelet" --help 2>/dev/null |
		grep -oE '\b[A-Z][A-Za-z0-9]+=true\|false' | cut -d= -f1 | sort -u)
	grep -qx "$1" <<<"$KNOWN_GATES"
}

# native_gates_known: those of NATIVE_GATES the kubelet has, comma-separated.
native_gates_known() {
	local g out=""
	for g in "${NATIVE_GATES[@]}"; do ! known_gate "$g" || out+="${out:+,}$g"; done
	echo "$out"
}

# kubelet_config FILE RUNTIME_SOCK MANIFEST_DIR NATIVE_GATES [REDUCED_DECAY [RESTART_ALL]]
# A gate given as "" keeps the kubelet's default; a gate this kubelet does
# not have is left out. NATIVE_GATES sets the native restart's gates;
# RESTART_ALL only RestartAllContainersOnContainerExits, the one that makes
# the kubelet own the AllContainersRestarting condition
# (internal/podstatus/owner.go).
kubelet_config() {
	mkdir -p "$3"
	local gates="" g
	if [[ -n $4 ]]; then
		for g in "${NATIVE_GATES[@]}"; do ! known_gate "$g" || gates+="  $g: $4"$'\n'; done
	fi
	[[ -z ${5:-} ]] || ! known_gate ReduceDefaultCrashLoopBackOffDecay || gates+="  ReduceDefaultCrashLoopBackOffDecay: $5"$'\n'
	[[ -z ${6:-} ]] || ! known_gate RestartAllContainersOnContainerExits || gates+="  RestartAllContainersOnContainerExits: $6"$'\n'
	cat >"$1" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$2
imageServiceEndpoint: unix://$2
staticPodPath: $3
${gates:+featureGates:
$gates}fileCheckFrequency: 1s
syncFrequency: 10s
podLogsDir: $NODE_DATA/pod-logs
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
${CGROUP_ROOT:+cgroupRoot: $CGROUP_ROOT}
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
failSwapOn: false
failCgroupV1: false
cgroupDriver: cgroupfs
enforceNodeAllocatable: []
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: ""
YAML
}

write_configs() {
	mkdir -p "$NODE_RUN"/{containerd,cri-shim,cni/net.d,certs.d} "$NODE_DATA"/{containerd,kubelet,pod-logs} "$MANIFESTS"
	# The shim's state (tokens, checkpoint records) is private, as systemd's
	# StateDirectoryMode makes it on a node.
	install -d -m 0700 "$NODE_DATA/cri-shim"
	# The bridge subnet is private to this machine; nothing is routed off it.
	cat >"$NODE_RUN/cni/net.d/10-cri-shim.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "$NODE_NAME",
  "plugins": [
    {"type": "bridge", "bridge": "$CNI_BRIDGE", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET"}]], "routes": [{"dst": "0.0.0.0/0"}],
              "dataDir": "$NODE_DATA/cni-ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
JSON
	# Plain-HTTP pulls from the loopback test registry (critest), if one runs.
	mkdir -p "$NODE_RUN/certs.d/$REGISTRY_ADDR"
	cat >"$NODE_RUN/certs.d/$REGISTRY_ADDR/hosts.toml" <<TOML
server = "http://$REGISTRY_ADDR"
[host."http://$REGISTRY_ADDR"]
  capabilities = ["pull", "resolve"]
TOML
	# restrict_oom_score_adj: this environment lacks CAP_SYS_RESOURCE, and runc fails
	# every sandbox when it may not lower oom_score_adj (shared/NODE-STACK.md).
	# containerd's own restore through CreateContainer, off by default in
	# 2.2.9 and 2.3 and gone in 2.4: switched on only for the benchmark's
	# comparison with the route cri-shim used before (make bench-checkpoint-baseline).
	VIA_CREATE=""
	if [[ ${CRI_SHIM_CONTAINERD_RESTORE_VIA_CREATE:-} == 1 ]]; then
		VIA_CREATE="  enable_experimental_restore_via_create = true"$'\n'
	fi
	cat >"$NODE_RUN/containerd/config.toml" <<TOML
version = 3
root = "$NODE_DATA/containerd"
state = "$NODE_RUN/containerd/state"
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$NODE_RUN/containerd/containerd.sock.ttrpc"
[debug]
  address = "$NODE_RUN/containerd/debug.sock"
# NRI off: nothing here uses it, and containerd 2.2.1 panics in it
# (nri GetIPs on a nil sandbox) removing a container whose sandbox is already
# gone, which a teardown racing a restart leaves behind; the panic kept such
# containers for every later node started on the same data directory.
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  enable_cdi = false
$VIA_CREATE  # The pods' handler runs cri-shim's runtime shim, which is containerd's
  # runc shim plus the restore of containers cri-shim marked, as
  # deploy/containerd-cri-shim.toml sets it on a node.
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    runtime_path = "$RUNTIME_SHIM_BIN"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$NODE_RUN/cni/net.d"
[plugins.'io.containerd.cri.v1.images']
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "localhost/cri-shim/pause:1"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$NODE_RUN/certs.d"
TOML
	cat >"$NODE_RUN/cri-shim/config.toml" <<TOML
state_dir = "$NODE_DATA/cri-shim"
[server]
  listen = "$SHIM_SOCK"
[runtime]
  endpoint = "$CONTAINERD_SOCK"
[metrics]
  address = "$SHIM_METRICS"
[log]
  level = "info"
  format = "json"
[checkpoint]
  root = "$NODE_DATA/checkpoints"
  # The suite restores from references the CLI pushed; the default, cluster
  # (only checkpoints a node exported), is TestPodCheckpointExport's.
  restore_provenance = "any"
  # The suite checkpoints a pod several times in a row; the gap between a
  # pod's checkpoints (default 10s) is TestCheckpointAdmissionPodMinGap's.
  pod_min_gap = "0s"
TOML
	if [[ -n $SHIM_EXTRA ]]; then
		{ echo; cat "$SHIM_EXTRA"; } >>"$NODE_RUN/cri-shim/config.toml"
	fi
	if [[ -n $SHIM_API ]]; then
		printf '\n[kubernetes]\n  kubeconfig = "%s"\n  node_name = "%s"\n' "$KUBELET_KUBECONFIG" "$NODE_NAME" >>"$NODE_RUN/cri-shim/config.toml"
	fi
	cat >"$NODE_RUN/crictl.yaml" <<YAML
runtime-endpoint: unix://$SHIM_SOCK
image-endpoint: unix://$SHIM_SOCK
timeout: 30
YAML
	# Standalone kubelets (no API server). cgroup v1 host: failCgroupV1 false, cgroupfs.
	# "kubelet" runs through cri-shim with the kubelet's default feature gates
	# (the native in-place restart gates are Beta and on in v1.36 and v1.37,
	# alpha and off in v1.35, absent in v1.34; the shim's pods use its
	# annotations, not the native fields); "kubelet-native" talks to
	# containerd directly with them ON, for comparison, where the kubelet has
	# them (KUBELET_NATIVE_GATES in the env says which it has on).
	kubelet_config "$NODE_RUN/kubelet.yaml" "$SHIM_SOCK" "$MANIFESTS" ""
	kubelet_config "$NODE_RUN/kubelet-native.yaml" "$CONTAINERD_SOCK" "$MANIFESTS_NATIVE" true
	# For the backoff benchmark: through the shim, with the kubelet's own KEP-4603 curve on.
	kubelet_config "$NODE_RUN/kubelet-reduced.yaml" "$SHIM_SOCK" "$MANIFESTS" "" true
	# For the status test: through the shim with RestartAllContainersOnContainerExits
	# off, so the kubelet neither declares the feature nor owns
	# AllContainersRestarting and the shim writes it. Kubelets before v1.35 do
	# not know the gate (kubernetes v1.35.4 pkg/features/kube_features.go
	# adds it, alpha): kubelet_config leaves it out there, where it is off anyway.
	kubelet_config "$NODE_RUN/kubelet-nogate.yaml" "$SHIM_SOCK" "$MANIFESTS" "" "" false
	# For the deploy test: a kubelet configured for containerd, switched to the
	# shim only by deploy/kubelet/50-cri-shim.conf in its --config-dir.
	kubelet_config "$NODE_RUN/kubelet-base.yaml" "$CONTAINERD_SOCK" "$MANIFESTS" ""
	mkdir -p "$NODE_RUN/kubelet.conf.d"
	sed "s#unix:///run/cri-shim/cri-shim.sock#unix://$SHIM_SOCK#" "$REPO/deploy/kubelet/50-cri-shim.conf" \
		>"$NODE_RUN/kubelet.conf.d/50-cri-shim.conf"
	cat >"$NODE_RUN/env" <<ENV
CONTAINERD_VERSION=$CONTAINERD_VERSION
KUBELET_VERSION=$KUBELET_VERSION
KUBELET_NATIVE_GATES=$(native_gates_known)
NODE_RUN=$NODE_RUN
NODE_DATA=$NODE_DATA
STACK=$STACK
BIN=$NODE_BIN
LANE=$LANE
NODE2_RUN=$NODE2_RUN
CONTAINERD_SOCK=$CONTAINERD_SOCK
SHIM_SOCK=$SHIM_SOCK
SHIM_METRICS=$SHIM_METRICS
SHIM_BIN=$SHIM_BIN
KUBELET_PORT=$KUBELET_PORT
KUBELET_HEALTHZ_PORT=$KUBELET_HEALTHZ_PORT
MANIFESTS=$MANIFESTS
MANIFESTS_NATIVE=$MANIFESTS_NATIVE
REGISTRY_ADDR=$REGISTRY_ADDR
REGISTRY_TLS_ADDR=$REGISTRY_TLS_ADDR
REGISTRY_AUTH_ADDR=$REGISTRY_AUTH_ADDR
REGISTRY_AUTH_DIR=$REGISTRY_AUTH_DIR
PKI=$PKI
CRICTL_CONFIG=$NODE_RUN/crictl.yaml
CHECKPOINTS=$NODE_DATA/checkpoints
SHIM_CONFIG=$NODE_RUN/cri-shim/config.toml
NODE_NAME=$NODE_NAME
CNI_BRIDGE=$CNI_BRIDGE
POD_SUBNET=$POD_SUBNET
CGROUP_ROOT=$CGROUP_ROOT
ETCD_PORT=$ETCD_PORT
APISERVER_PORT=$APISERVER_PORT
ADMIN_KUBECONFIG=$ADMIN_KUBECONFIG
KUBELET_KUBECONFIG=$KUBELET_KUBECONFIG
ROUTER_KUBECONFIG=$ROUTER_KUBECONFIG
ROUTER_METRICS=$ROUTER_METRICS
ENV
}

start_containerd() {
	spawn containerd containerd --config "$NODE_RUN/containerd/config.toml"
	wait_for 30 containerd crictl --config /dev/null --runtime-endpoint "unix://$CONTAINERD_SOCK" version ||
		{ tail -n 30 "$NODE_RUN/containerd.log" >&2; return 1; }
}

import_images() {
	for img in "$STACK"/images/*.tar; do
		ctr --address "$CONTAINERD_SOCK" -n k8s.io images import --local "$img" >/dev/null
	done
}

start_shim() {
	[[ -x $SHIM_BIN ]] || { log "missing $SHIM_BIN: run make build"; return 1; }
	spawn cri-shim "$SHIM_BIN" serve --config "$NODE_RUN/cri-shim/config.toml"
	wait_for 30 cri-shim crictl --config /dev/null --runtime-endpoint "unix://$SHIM_SOCK" version ||
		{ tail -n 30 "$NODE_RUN/cri-shim.log" >&2; return 1; }
}

# registry_config NAME ADDR [tls [HTPASSWD]]: the config of the registry
# instance NAME on ADDR, $NODE_RUN/NAME.yaml, its storage $NODE_DATA/NAME;
# tls: HTTPS with pki.sh's certificate; HTPASSWD: the file of the logins it
# asks for (basic auth).
registry_config() {
	local name=$1 addr=$2 tls=${3:-} htpasswd=${4:-}
	mkdir -p "$NODE_DATA/$name"
	{
		cat <<YAML
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $NODE_DATA/$name}
  delete: {enabled: true}
http:
  addr: $addr
YAML
		[[ -z $tls ]] || echo "  tls: {certificate: $PKI/registry.crt, key: $PKI/registry.key}"
		[[ -z $htpasswd ]] || printf 'auth:\n  htpasswd: {realm: cri-shim-test, path: %s}\n' "$htpasswd"
	} >"$NODE_RUN/$name.yaml"
}

# The loopback registry serves critest's test images under the names critest
# asks for once --registry-prefix points at it; they are busybox-based stand-ins.
# critest v1.34 drops the tag when it re-prefixes a name (PrepareImageName uses
# reference.Path), so every image is also pushed as :latest.
start_registry() {
	[[ -x $STACK/bin/registry ]] || { log "missing registry: make e2e builds it (test/stack/install.sh registry)"; return 1; }
	registry_config registry "$REGISTRY_ADDR"
	spawn registry registry serve "$NODE_RUN/registry.yaml"
	wait_for 30 registry curl -sf "http://$REGISTRY_ADDR/v2/"
	local mk=$STACK/images/mkimage r=$REGISTRY_ADDR bb=(--busybox /bin/busybox)
	local web=(--cmd sh --cmd -c --cmd 'mkdir -p /www /var/run && echo ok >/www/index.html && echo $$ >/var/run/nginx.pid && exec httpd -f -p 80 -h /www')
	"$mk" --push --tag latest --name "$r/e2e-test-images/busybox:1.29-2" "${bb[@]}" --cmd sh
	"$mk" --push --tag latest --name "$r/e2e-test-images/nginx:1.14-2" "${bb[@]}" "${web[@]}"
	"$mk" --push --tag latest --name "$r/e2e-test-images/httpd:2.4.39-4" "${bb[@]}" "${web[@]}"
	"$mk" --push --name "$r/k8s-staging-cri-tools/test-image-user-uid:latest" "${bb[@]}" --cmd sh --user 1002
	"$mk" --push --name "$r/k8s-staging-cri-tools/test-image-user-username:latest" "${bb[@]}" --cmd sh --user www-data
	"$mk" --push --name "$r/k8s-staging-cri-tools/test-image-latest:latest" "${bb[@]}" --cmd sh
	"$mk" --push --name "$r/k8s-staging-cri-tools/test-image-tag:test" --tag all --tag latest "${bb[@]}" --cmd sh --env IMAGE=tag
	"$mk" --push --name "$r/k8s-staging-cri-tools/test-image-tags:1" --tag 2 --tag 3 --tag latest "${bb[@]}" --cmd sh --env IMAGE=tags
	for i in 1 2 3; do
		"$mk" --push --name "$r/k8s-staging-cri-tools/test-image-$i:latest" "${bb[@]}" --cmd sh --env "IMAGE=$i"
	done
	# Many specs pull the prefixed name and then create containers under the
	# original one, so the stand-ins are also imported under the original names.
	local tmp
	tmp=$(mktemp -d)
	"$mk" --name registry.k8s.io/e2e-test-images/busybox:1.29-2 "${bb[@]}" --cmd sh --out "$tmp/busybox.tar"
	"$mk" --name registry.k8s.io/e2e-test-images/nginx:1.14-2 "${bb[@]}" "${web[@]}" --out "$tmp/nginx.tar"
	"$mk" --name registry.k8s.io/e2e-test-images/httpd:2.4.39-4 "${bb[@]}" "${web[@]}" --out "$tmp/httpd.tar"
	for img in "$tmp"/*.tar; do
		ctr --address "$CONTAINERD_SOCK" -n k8s.io images import --local "$img" >/dev/null
	done
	rm -rf "$tmp"
}

# The machine's own address for the API server to advertise (the kubernetes
# Service's endpoint may not be a loopback address); nothing is sent to it.
host_address() {
	local a
	a=$(ip -4 -o addr show scope global 2>/dev/null | awk '{split($4, x, "/"); print x[1]; exit}')
	echo "${a:-127.0.0.1}"
}

# start_registry_tls: an empty registry on REGISTRY_TLS_ADDR serving HTTPS
# with pki.sh's certificate (clients trust $PKI/ca.crt), for pushes and
# pulls of checkpoint images over TLS.
start_registry_tls() {
	[[ -x $STACK/bin/registry ]] || { log "missing registry: make e2e builds it (test/stack/install.sh registry)"; return 1; }
	"$(dirname "${BASH_SOURCE[0]}")/pki.sh"
	registry_config registry-tls "$REGISTRY_TLS_ADDR" tls
	spawn registry-tls registry serve "$NODE_RUN/registry-tls.yaml"
	wait_for 30 registry-tls curl -sf --cacert "$PKI/ca.crt" "https://$REGISTRY_TLS_ADDR/v2/"
}

# start_registry_auth: a third registry, empty, over HTTPS on
# REGISTRY_AUTH_ADDR with pki.sh's certificate (as registry-tls), that wants
# a login: htpasswd basic auth, which distribution accepts only over TLS.
# Its two users, user1 and user2, get random passwords when the node's first
# start of it makes $REGISTRY_AUTH_DIR (under $NODE_RUN: gone with down.sh);
# $REGISTRY_AUTH_DIR/<user>.json is a docker config.json with that user's
# login, for `cri-shim checkpoint push --registry-config` and as the
# .dockerconfigjson of a pod's image pull secret. The bcrypt hashes come from
# test/stack/tools/registry/htpasswd, built with the caller's go.
start_registry_auth() {
	[[ -x $STACK/bin/registry ]] || { log "missing registry: make e2e builds it (test/stack/install.sh registry)"; return 1; }
	"$(dirname "${BASH_SOURCE[0]}")/pki.sh"
	local dir=$REGISTRY_AUTH_DIR
	if [[ ! -s $dir/htpasswd ]]; then
		[[ -n $GO ]] || { log "registry-auth: no go on PATH to build its password hasher"; return 1; }
		install -d -m 0700 "$dir"
		(cd "$REPO/test/stack/tools/registry" && GOFLAGS=-mod=readonly "$GO" build -o "$dir/htpasswd-bcrypt" ./htpasswd)
		local u pw logins=
		for u in user1 user2; do
			pw=$(openssl rand -hex 16)
			logins+="$u $pw"$'\n'
			printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$REGISTRY_AUTH_ADDR" "$(printf '%s:%s' "$u" "$pw" | base64 -w0)" >"$dir/$u.json"
		done
		"$dir/htpasswd-bcrypt" <<<"$logins" >"$dir/htpasswd.tmp"
		mv "$dir/htpasswd.tmp" "$dir/htpasswd"
	fi
	registry_config registry-auth "$REGISTRY_AUTH_ADDR" tls "$dir/htpasswd"
	spawn registry-auth registry serve "$NODE_RUN/registry-auth.yaml"
	# Up, and asking for a login: 401 to a request without one.
	wait_for 30 registry-auth sh -c '[ "$(curl -s -o /dev/null -w "%{http_code}" --cacert "$1" "https://$2/v2/")" = 401 ]' \
		_ "$PKI/ca.crt" "$REGISTRY_AUTH_ADDR" || { tail -n 30 "$NODE_RUN/registry-auth.log" >&2; return 1; }
}

# start_apiserver: etcd and kube-apiserver on loopback, certificates by pki.sh.
start_apiserver() {
	for b in etcd kube-apiserver kubectl; do
		[[ -x $STACK/bin/$b ]] || { log "missing $b: make run builds it (test/stack/install.sh --set run)"; return 1; }
	done
	"$(dirname "${BASH_SOURCE[0]}")/pki.sh"
	mkdir -p "$NODE_DATA/etcd"
	chmod 700 "$NODE_DATA/etcd"
	# A throw-away test store: no fsync (etcd's own flag for tests).
	spawn etcd etcd --name cri-shim-test --data-dir "$NODE_DATA/etcd" --unsafe-no-fsync \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "cri-shim-test=http://127.0.0.1:$ETCD_PEER_PORT"
	wait_for 30 etcd curl -sf "http://127.0.0.1:$ETCD_PORT/health" ||
		{ tail -n 30 "$NODE_RUN/etcd.log" >&2; return 1; }
	spawn kube-apiserver kube-apiserver --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
		--bind-address 127.0.0.1 --advertise-address "$(host_address)" --secure-port "$APISERVER_PORT" \
		--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
		--client-ca-file "$PKI/ca.crt" \
		--kubelet-client-certificate "$PKI/admin.crt" --kubelet-client-key "$PKI/admin.key" \
		--service-account-issuer https://kubernetes.default.svc \
		--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
		--service-cluster-ip-range 10.96.0.0/16 \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction
	wait_for 90 kube-apiserver curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
		"https://127.0.0.1:$APISERVER_PORT/readyz" ||
		{ tail -n 30 "$NODE_RUN/kube-apiserver.log" >&2; return 1; }
	apply_deploy && start_router
}

# start_router: the PodCheckpoint router (`cri-shim router`), the cluster's
# one, as its service account (deploy/rbac/router.yaml).
start_router() {
	[[ -x $SHIM_BIN ]] || { log "missing $SHIM_BIN: run make build"; return 1; }
	spawn cri-shim-router "$SHIM_BIN" router --kubeconfig "$ROUTER_KUBECONFIG" --metrics-address "$ROUTER_METRICS"
	wait_for 30 cri-shim-router curl -sf "http://$ROUTER_METRICS/healthz" ||
		{ tail -n 30 "$NODE_RUN/cri-shim-router.log" >&2; return 1; }
}

# apply_deploy: the cluster-wide objects cri-shim ships (CRD, RBAC, admission
# policies), as an operator applies them; waits until the CRD is served.
apply_deploy() {
	local kc=("$STACK/bin/kubectl" --kubeconfig "$ADMIN_KUBECONFIG")
	"${kc[@]}" apply -f "$REPO/deploy/crd" >/dev/null &&
		"${kc[@]}" wait --for condition=Established --timeout 30s -f "$REPO/deploy/crd" >/dev/null &&
		"${kc[@]}" apply -f "$REPO/deploy/rbac" -f "$REPO/deploy/admission" >/dev/null ||
		{ log "applying deploy/ to the API server failed"; return 1; }
}

# make_cgroup_root: the kubelet's cgroupRoot, when it is not "/", must exist
# in every cgroup v1 hierarchy it uses before it starts (kubernetes v1.36.3
# pkg/kubelet/cm/container_manager_linux.go, NewContainerManager:
# cgroupManager.Validate(cgroupRoot); cgroup_v1_manager_linux.go, Validate:
# cpu, cpuacct, cpuset, memory, systemd (name=systemd), pids, and hugetlb when
# mounted). It is made in every v1 hierarchy; cpuset's gets its parent's cpus
# and mems, or no task could join it.
make_cgroup_root() {
	[[ -n $CGROUP_ROOT && $CGROUP_ROOT != / ]] || return 0
	local mp
	awk '$3 == "cgroup" {print $2}' /proc/self/mounts | while read -r mp; do
		mkdir -p "$mp$CGROUP_ROOT"
		if [[ -f $mp$CGROUP_ROOT/cpuset.cpus && -z $(cat "$mp$CGROUP_ROOT/cpuset.cpus") ]]; then
			cat "$mp/cpuset.cpus" >"$mp$CGROUP_ROOT/cpuset.cpus"
			cat "$mp/cpuset.mems" >"$mp$CGROUP_ROOT/cpuset.mems"
		fi
	done
}

# start_kubelet [native|reduced|api|api-nogate|dropin]: one kubelet at a time
# (same ports, same pid file). api: through the shim, registered with the API
# server; api-nogate: the same with RestartAllContainersOnContainerExits off.
start_kubelet() {
	[[ -x $NODE_BIN/kubelet ]] || { log "missing kubelet: run test/stack/install.sh"; return 1; }
	make_cgroup_root
	local cfg=$NODE_RUN/kubelet.yaml root=$NODE_DATA/kubelet extra=()
	if [[ ${1:-} == native ]]; then cfg=$NODE_RUN/kubelet-native.yaml root=$NODE_DATA/kubelet-native; fi
	if [[ ${1:-} == reduced ]]; then cfg=$NODE_RUN/kubelet-reduced.yaml; fi
	if [[ ${1:-} == api ]]; then extra=(--kubeconfig "$KUBELET_KUBECONFIG"); fi
	if [[ ${1:-} == api-nogate ]]; then cfg=$NODE_RUN/kubelet-nogate.yaml extra=(--kubeconfig "$KUBELET_KUBECONFIG"); fi
	if [[ ${1:-} == dropin ]]; then cfg=$NODE_RUN/kubelet-base.yaml extra=(--config-dir "$NODE_RUN/kubelet.conf.d"); fi
	spawn kubelet kubelet --config "$cfg" --root-dir "$root" "${extra[@]}" \
		--hostname-override "$NODE_NAME" --v 2
	wait_for 90 kubelet curl -sf "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz" ||
		{ tail -n 40 "$NODE_RUN/kubelet.log" >&2; return 1; }
}

if [[ -n $ONLY ]]; then
	[[ -f $NODE_RUN/env ]] || { log "no node running (no $NODE_RUN/env): run up.sh first"; exit 1; }
	case $ONLY in
	containerd) start_containerd ;;
	cri-shim) start_shim ;;
	kubelet) start_kubelet ;;
	kubelet-native) start_kubelet native ;;
	kubelet-reduced) start_kubelet reduced ;;
	kubelet-api) start_kubelet api ;;
	kubelet-api-nogate) start_kubelet api-nogate ;;
	kubelet-dropin) start_kubelet dropin ;;
	apiserver) start_apiserver ;;
	router) start_router ;;
	registry) start_registry ;;
	registry-tls) start_registry_tls ;;
	registry-auth) start_registry_auth ;;
	*) log "--start: unknown component $ONLY"; exit 2 ;;
	esac
	exit 0
fi

# The node's pair of the version matrix.
missing=$(stack_missing "$STACK" "$CONTAINERD_VERSION" "$KUBELET_VERSION")
[[ -z $missing ]] || { while read -r m; do log "$m"; done <<<"$missing"; exit 1; }
log "containerd $CONTAINERD_VERSION, kubelet $KUBELET_VERSION${LANE_SUFFIX:+ (lane $LANE)}"
for b in crictl runc criu; do
	[[ -x $STACK/bin/$b ]] || command -v "$b" >/dev/null || { log "missing $b: make run builds it (test/stack/install.sh --set run)"; exit 1; }
done
[[ -x $RUNTIME_SHIM_BIN ]] || { log "missing $RUNTIME_SHIM_BIN: run make build"; exit 1; }
"$(dirname "${BASH_SOURCE[0]}")/down.sh" --quiet || true
# The node's own bin directory: every program of the stack, and its pair.
mkdir -p "$NODE_BIN"
for f in "$STACK"/bin/*; do ln -sfn "$f" "$NODE_BIN/${f##*/}"; done
for b in containerd containerd-shim-runc-v2 ctr; do
	ln -sfn "$STACK/versions/containerd-$CONTAINERD_VERSION/$b" "$NODE_BIN/$b"
done
ln -sfn "$STACK/versions/kubernetes-$KUBELET_VERSION/kubelet" "$NODE_BIN/kubelet"
# A fresh node: no static pods or kubelet state from an earlier run (the
# containerd root is kept so images need not be imported again).
rm -rf "$MANIFESTS" "$MANIFESTS_NATIVE" "$NODE_DATA/kubelet" "$NODE_DATA/kubelet-native" "$NODE_DATA/pod-logs" "$NODE_DATA/cri-shim" "$NODE_DATA/checkpoints" "$NODE_DATA/bench" \
	"$NODE_DATA/etcd"
# The certificates go with the node that made them, never another node's (--join).
[[ -n $JOIN ]] || rm -rf "$PKI"
write_configs
if [[ -n $JOIN ]]; then
	# A client certificate for this node, signed by the other node's CA,
	# before the shim starts: its [kubernetes] kubeconfig may be this one.
	[[ -f $PKI/ca.key ]] || { log "--join: no CA in $PKI: start the API server's node first"; exit 1; }
	"$(dirname "${BASH_SOURCE[0]}")/pki.sh"
fi
start_containerd
import_images
start_shim
if [[ -n $APISERVER ]]; then
	start_apiserver
fi
if [[ -n $KUBELET ]]; then
	for m in "${MANIFEST_FILES[@]}"; do cp "$m" "$MANIFESTS/"; done
	if [[ -n $APISERVER || -n $JOIN ]]; then start_kubelet api; else start_kubelet; fi
fi
log "node up; env in $NODE_RUN/env"
