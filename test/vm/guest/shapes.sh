# Sourced by run.sh for the shapes suite: containerd's main-config shapes
# (/payload/shapes: test/testdata/containerd-shapes) on each containerd
# version of the payload (/payload/containerd/VERSION), on the node run.sh
# set up and installed cri-shim on (the kubelet on the shim's socket). One
# CheckpointPod of a counting pod first; then, for each version x shape, as
# an operator whose node has that containerd and that config:
#   containerd stopped, that version's binaries in place, /etc/containerd
#   replaced by the shape's files, containerd started; its effective config
#   dumped; deploy/install.sh --with-containerd (which checks its own dump
#   diff and restarts containerd); the dump again: only the runc handler's
#   runtime_path changed; containerd answers on its socket and through the
#   shim; a static pod restored from the checkpoint runs and counts on; the
#   pod removed and its sandbox gone.
# Each combination records "PASS shape-VERSION-SHAPE" or a FAIL with why.
# The kubelet and cri-shim run throughout: the kubelet's CRI calls go to the
# shim, which reconnects to containerd by itself (internal/proxy/backend.go,
# runtime.reconnect_max_delay).

SHAPE_VERSIONS=(2.2.9 2.3.7 2.4.2)
SHAPES=(v2 v2-imports v3 v3-imports none)
CTRD_SOCK=unix:///run/containerd/containerd.sock
crictl_ctrd() { crictl --runtime-endpoint "$CTRD_SOCK" --image-endpoint "$CTRD_SOCK" "$@"; }

# ctrd_server_version: the version the running containerd answers with.
ctrd_server_version() {
	ctr version 2>/dev/null | awk '/^Server:/ { s = 1 } s && $1 == "Version:" { print $2; exit }'
}

# cri_ready ENDPOINT: the CRI runtime at ENDPOINT reports RuntimeReady and
# NetworkReady.
cri_ready() {
	local conds
	conds=$(crictl --runtime-endpoint "$1" info -o go-template --template '{{range .status.conditions}}{{.type}}={{.status}} {{end}}' 2>/dev/null) || return 1
	[[ $conds == *RuntimeReady=true* && $conds == *NetworkReady=true* ]]
}

# sandbox_image DUMP: the pause image a `containerd config dump` names
# (version 2: sandbox_image; version 3 and later: pinned_images.sandbox).
sandbox_image() {
	grep -m1 -oE "^[[:space:]]*sandbox(_image)?[[:space:]]*=[[:space:]]*['\"][^'\"]+" "$1" | sed -E "s/.*['\"]//"
}

# The cgroup driver the kubelet runs with: the one containerd reported when
# the kubelet started (node.sh's config: SystemdCgroup = true). The kubelet
# asks the CRI for it once, at its start (KubeletCgroupDriverFromCRI, GA
# and locked on since 1.34: kubernetes cmd/kubelet/app/server.go,
# getCgroupDriverFromCRI); containerd answers with its runc handler's
# SystemdCgroup (internal/cri/server/runtime_config_linux.go, getCgroupDriver).
KUBELET_DRIVER=systemd

# cgroup_driver DUMP: the driver containerd reports for a `containerd config
# dump` (its runc handler's SystemdCgroup).
cgroup_driver() { if grep -Eq '^[[:space:]]*SystemdCgroup = true' "$1"; then echo systemd; else echo cgroupfs; fi; }

# combo_step WHAT: a progress line of the combination shape_combo runs (its
# name and start, from its locals), on the console.
combo_step() { echo "  $name +$((SECONDS - t0)) s: $*"; }

check_shapes() {
	if ! counting_checkpoint shape-count shape-count-cp; then
		fail shapes-checkpoint "$CHECK_WHY"
		return
	fi
	local v s
	for v in "${SHAPE_VERSIONS[@]}"; do
		for s in "${SHAPES[@]}"; do
			shape_combo "$v" "$s"
		done
	done
}

# shape_combo VERSION SHAPE: one combination (see the top of this file).
shape_combo() {
	local v=$1 s=$2 name=shape-$1-$2 t0=$SECONDS dir=$OUT/shapes/shape-$1-$2 why= b img up= restored=
	mkdir -p "$dir"
	systemctl stop containerd.service
	# A rename: a running runc shim keeps the binary it runs.
	for b in containerd containerd-shim-runc-v2 ctr; do
		install -m 0755 "$P/containerd/$v/$b" "/usr/local/bin/.$b.new" && mv -f "/usr/local/bin/.$b.new" "/usr/local/bin/$b"
	done
	rm -rf /etc/containerd
	if [[ -d $P/shapes/$s/etc ]]; then cp -a "$P/shapes/$s/etc/." /etc/; fi
	# install.sh's record of containerd's files names the previous
	# combination's (this one replaced them): without it, this run is the
	# first on these files, as on the operator's node, and keeps the
	# operator's main config as the backup --uninstall puts back.
	sed -i '\#^[fd] /etc/containerd\(/\|$\)#d' /var/lib/cri-shim-install/files
	rm -rf /var/lib/cri-shim-install/backup/etc/containerd
	systemctl start containerd.service || why+="containerd did not start on the shape's config; "
	wait_for 60 "containerd $v" ctr version || why+="containerd $v does not answer on the shape's config; "
	combo_step "containerd $v up on the shape's files"
	[[ $(ctrd_server_version) == "$v"* ]] || why+="containerd answers as $(ctrd_server_version), not $v; "
	containerd config dump >"$dir/before.toml" 2>"$dir/before.err" || why+="config dump before: $(head -c 200 "$dir/before.err"); "
	# The pause image the shape names: the imported one under that name
	# (there is no registry to pull it from).
	img=$(sandbox_image "$dir/before.toml")
	if [[ -z $img ]]; then
		why+="no sandbox image in the dump; "
	else
		ctr -n k8s.io images tag --force localhost/cri-shim/pause:1 "$img" >/dev/null || why+="cannot tag the pause image as $img; "
	fi
	"$P/repo/deploy/install.sh" --binary "$P/repo/_output/cri-shim" --with-containerd >"$dir/install.log" 2>&1 ||
		why+="install.sh exit $?: $(tail -n 3 "$dir/install.log" | tr '\n' ' '); "
	combo_step "install.sh done"
	containerd config dump >"$dir/after.toml" 2>"$dir/after.err" || why+="config dump after: $(head -c 200 "$dir/after.err"); "
	config_only_runtime_path "$dir/before.toml" "$dir/after.toml" || why+="$CHECK_WHY; "
	# A main config install.sh changed is kept as the shape's own file.
	if grep -qxF "f /etc/containerd/config.toml" /var/lib/cri-shim-install/files; then
		local backup=/var/lib/cri-shim-install/backup/etc/containerd/config.toml
		if [[ -f $P/shapes/$s/etc/containerd/config.toml ]]; then
			cmp -s "$backup" "$P/shapes/$s/etc/containerd/config.toml" || why+="install.sh's backup of the main config is not the shape's; "
		elif [[ -e $backup ]]; then
			why+="install.sh kept a backup of a main config the shape does not have; "
		fi
	fi
	if wait_for 60 "containerd $v ready" cri_ready "$CTRD_SOCK" && wait_for 60 "the shim ready" cri_ready "$SHIM_SOCK"; then
		up=$((SECONDS - t0))
		combo_step "containerd and the shim ready"
	else
		why+="not ready (containerd: $(crictl_ctrd info -o go-template --template '{{range .status.conditions}}{{.type}}={{.status}} {{.reason}} {{end}}' 2>&1 | head -c 300); through the shim: $(crictl_shim version 2>&1 | tail -n 1)); "
	fi
	[[ $(ctrd_server_version) == "$v"* ]] || why+="after install.sh containerd answers as $(ctrd_server_version), not $v; "
	# A shape whose cgroup driver is not the one the kubelet started with (the
	# none shape: containerd's default, cgroupfs) is a node whose kubelet
	# started on that containerd: the kubelet is restarted, as it would have
	# been started on that node, and learns the driver from the CRI.
	local driver
	driver=$(cgroup_driver "$dir/after.toml")
	if [[ -z $why && $driver != "$KUBELET_DRIVER" ]]; then
		systemctl restart kubelet.service
		if wait_for 120 "the kubelet's healthz" bash -c 'exec 3<>/dev/tcp/127.0.0.1/10248 && printf "GET /healthz HTTP/1.0\r\n\r\n" >&3 && grep -q ok <&3'; then
			KUBELET_DRIVER=$driver
			combo_step "kubelet restarted for the $driver cgroup driver ($(journalctl -u kubelet -n 400 --no-pager | grep -o 'cgroupDriver="[a-z]*"' | tail -n 1))"
		else
			why+="the kubelet restarted for the $driver cgroup driver is not healthy; "
		fi
	fi
	local pod=shape-${v//./}-${s//-/} # no pod name a prefix of another
	if [[ -z $why ]]; then
		if RESTORE_WAIT=180 restored_counts "$pod" shape-count-cp "$CP_AT"; then
			restored=$((SECONDS - t0))
		else
			why+="$CHECK_WHY; "
		fi
	fi
	rm -f "/etc/kubernetes/manifests/$pod.yaml"
	# Gone: the kubelet stops the pod; its sandbox, no longer ready, is
	# removed here rather than at the kubelet's next garbage collection (a
	# minute or more), so that the next combination starts without it.
	combo_step "restore done; removing $pod"
	if wait_for 120 "$pod stopped" bash -c "! crictl --runtime-endpoint $SHIM_SOCK pods --name '^$pod-' --state ready -q | grep -q ."; then
		local sb
		for sb in $(crictl_shim pods --name "^$pod-" -q 2>/dev/null); do crictl_shim rmp "$sb" >/dev/null 2>&1 || true; done
		crictl_shim pods --name "^$pod-" -q 2>/dev/null | grep -q . && why+="$pod's sandbox not removed; "
	else
		why+="$pod still ready 120 s after its manifest went; "
	fi
	if [[ -n $why ]]; then
		# What the node says of this combination, for the report.
		journalctl -u cri-shim --since "-$((SECONDS - t0 + 5))s" --no-pager >"$dir/cri-shim.journal" 2>&1
		journalctl -u kubelet --since "-$((SECONDS - t0 + 5))s" --no-pager | tail -n 300 >"$dir/kubelet.journal" 2>&1
		journalctl -u containerd --since "-$((SECONDS - t0 + 5))s" --no-pager | tail -n 300 >"$dir/containerd.journal" 2>&1
		crictl_shim ps -a >"$dir/crictl-ps.txt" 2>&1
	fi
	echo "$name: $((SECONDS - t0)) s (containerd and the shim ready at ${up:--} s, restored pod counting at ${restored:--} s)"
	[[ -z $why ]] && pass "$name" || fail "$name" "$why"
	sync # the payload disk holds what is written so far should the guest be stopped
}
