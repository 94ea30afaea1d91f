# shellcheck shell=bash disable=SC2034 # the variables are for the scripts that source this
# The version matrix (docs/compatibility.md) and which of it each make target
# builds; sourced by install.sh, env.sh, matrix.sh, e2e-lanes.sh and
# test/vm/run.sh. install.sh builds each containerd into
# $STACK/versions/containerd-<v>/ and each kubelet into
# $STACK/versions/kubernetes-<v>/; up.sh links the pair a node runs.
CONTAINERD_VERSIONS=(2.2.9 2.3.7 2.4.2)
KUBELET_VERSIONS=(1.34.4 1.35.4 1.36.3 1.37.2)
CONTAINERD_NEWEST=${CONTAINERD_VERSIONS[-1]}
KUBELET_NEWEST=${KUBELET_VERSIONS[-1]}
# The oldest supported pair: make test runs the matrix's subset on it.
CONTAINERD_OLDEST=${CONTAINERD_VERSIONS[0]}
KUBELET_OLDEST=${KUBELET_VERSIONS[0]}

# The sets install.sh builds (--set, CRI_SHIM_STACK_SET), each what its
# targets run and no more:
#   run   make run, bench-proxy, bench-fleet, node-vm: the newest pair, the
#         control plane, crictl, CRIU and the images.
#   test  make test and e2e, e2e-oldest, node-vm-shapes and the benches
#         through test/e2e: also the oldest kubelet (the oldest pair's lane),
#         every containerd (TestInstallContainerdConfigShapes and the VM's
#         shapes suite go through each), critest, the registry,
#         checkpointctl, promtool and systemd-analyze.
#   all   make stack, matrix and test-long: every kubelet too.
STACK_SETS=(run test all)

# stack_set_versions SET: the containerds and kubelets SET builds, in
# SET_CONTAINERDS and SET_KUBELETS; false for an unknown SET.
stack_set_versions() {
	case $1 in
	run) SET_CONTAINERDS=("$CONTAINERD_NEWEST") SET_KUBELETS=("$KUBELET_NEWEST") ;;
	test) SET_CONTAINERDS=("${CONTAINERD_VERSIONS[@]}") SET_KUBELETS=("$KUBELET_OLDEST" "$KUBELET_NEWEST") ;;
	all) SET_CONTAINERDS=("${CONTAINERD_VERSIONS[@]}") SET_KUBELETS=("${KUBELET_VERSIONS[@]}") ;;
	*) return 1 ;;
	esac
}

# stack_builder KIND VERSION: the make target whose stack has containerd or
# kubelet (KIND) VERSION, the smallest set first; false when VERSION is not
# in the matrix.
stack_builder() {
	local set v
	for set in "${STACK_SETS[@]}"; do
		stack_set_versions "$set"
		if [[ $1 == containerd ]]; then v=" ${SET_CONTAINERDS[*]} "; else v=" ${SET_KUBELETS[*]} "; fi
		if [[ $v == *" $2 "* ]]; then
			case $set in run) echo "make run" ;; test) echo "make test (make e2e)" ;; *) echo "make stack (make matrix)" ;; esac
			return 0
		fi
	done
	return 1
}

# stack_missing STACK CONTAINERD KUBELET: nothing when STACK has both
# builds; else a line for each missing one, naming the make target that
# builds it and install.sh's command for that version alone.
stack_missing() {
	local stack=$1 c=$2 k=$3 b by
	for b in containerd containerd-shim-runc-v2 ctr; do
		[[ -x $stack/versions/containerd-$c/$b ]] && continue
		if by=$(stack_builder containerd "$c"); then
			echo "containerd $c is not built in $stack: $by builds it, or test/stack/install.sh --containerd $c containerds"
		else
			echo "containerd $c is not in the matrix (${CONTAINERD_VERSIONS[*]}; test/stack/versions.sh)"
		fi
		break
	done
	[[ ! -x $stack/versions/kubernetes-$k/kubelet ]] || return 0
	if by=$(stack_builder kubelet "$k"); then
		echo "kubelet $k is not built in $stack: $by builds it, or test/stack/install.sh --kubelet $k kubelets"
	else
		echo "kubelet $k is not in the matrix (${KUBELET_VERSIONS[*]}; test/stack/versions.sh)"
	fi
}
