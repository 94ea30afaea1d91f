# Sourced by deploy/install.sh: the kubelet step (--with-kubelet). The
# kubelet is pointed at the shim by a KubeletConfiguration drop-in
# (deploy/kubelet/50-cri-shim.conf) in its --config-dir; the flag itself goes
# on the kubelet's ExecStart=, repeated from its unit and earlier drop-ins with
# the flag appended, because an environment variable can be undone by the
# kubelet package's environment files (kubeadm's 10-kubeadm.conf reads
# /etc/default/kubelet after its Environment= lines, and systemd lets
# EnvironmentFile= win over Environment=: systemd.exec(5)).
#
# Needs ROOT, HERE, TMP and place from files.sh.
KL_DROPIN=/etc/systemd/system/kubelet.service.d/20-cri-shim.conf
KL_CONFIG_DIR=/etc/kubernetes/kubelet.conf.d
# systemd's unit search path for system units, highest priority first
# (systemd.unit(5), "Unit File Load Path").
KL_UNIT_DIRS=(/etc/systemd/system /run/systemd/system /usr/local/lib/systemd/system /usr/lib/systemd/system /lib/systemd/system)

# kl_unit_files [SKIP]: kubelet.service and its drop-ins as systemd reads
# them: the unit from the first directory that has it, then the drop-ins of
# every directory, a name in a higher-priority directory hiding the same name
# in a lower one, in name order. SKIP (a path on the node) is left out.
kl_unit_files() {
	local skip=${1:-} d f name unit=
	local -A seen=()
	for d in "${KL_UNIT_DIRS[@]}"; do
		if [[ -z $unit && -f $ROOT$d/kubelet.service ]]; then unit=$d/kubelet.service; fi
	done
	[[ -n $unit ]] || return 1
	echo "$unit"
	for d in "${KL_UNIT_DIRS[@]}"; do
		for f in "$ROOT$d"/kubelet.service.d/*.conf; do
			[[ -f $f ]] || continue
			name=${f##*/}
			[[ -n ${seen[$name]:-} ]] && continue
			seen[$name]=${f#"$ROOT"}
		done
	done
	for name in $(printf '%s\n' "${!seen[@]}" | sort); do
		[[ ${seen[$name]} == "$skip" ]] || echo "${seen[$name]}"
	done
}

# kl_assignments KEY FILE...: the values of KEY= in the [Service] sections of
# FILEs (paths on the node), continuation lines joined, one a line, in order.
kl_assignments() {
	local key=$1 f
	shift
	for f in "$@"; do
		awk -v key="$key" '
			{ line = $0 }
			cont { line = acc " " line; cont = 0 }
			line ~ /\\$/ { acc = substr(line, 1, length(line) - 1); cont = 1; next }
			line ~ /^[[:space:]]*\[/ { svc = (line ~ /^[[:space:]]*\[Service\]/); next }
			svc && index(line, key "=") == 1 { print substr(line, length(key) + 2) }' "$ROOT$f"
	done
}

# kl_exec_start FILE...: the ExecStart= the files leave (an empty assignment
# resets the list); empty when none.
kl_exec_start() {
	local v last=
	while IFS= read -r v; do last=$v; done < <(kl_assignments ExecStart "$@")
	printf '%s' "$last"
}

# kl_config_dir FILE...: a --config-dir the kubelet already gets, from
# ExecStart=, Environment= or an EnvironmentFile= (kubeadm-flags.env,
# /etc/default/kubelet, /etc/sysconfig/kubelet, ...); empty when none.
kl_config_dir() {
	local texts f
	texts=$(kl_exec_start "$@"; echo; kl_assignments Environment "$@")
	while IFS= read -r f; do
		f=${f#-}
		[[ -f $ROOT$f ]] && texts+=$'\n'$(cat "$ROOT$f")
	done < <(kl_assignments EnvironmentFile "$@")
	grep -oE -- "--config-dir[= ][^\"' ]+" <<<"$texts" | tail -n 1 | sed -E 's/^--config-dir[= ]//' || true
}

# kl_plan: decides where the configuration drop-in goes and renders the
# systemd drop-in into $TMP/20-cri-shim.conf. Sets KL_DIR (the kubelet's
# drop-in directory) and KL_EXEC (the ExecStart= written; empty when the
# kubelet already has a --config-dir).
kl_plan() {
	local files dir exec
	if ! mapfile -t files < <(kl_unit_files "$KL_DROPIN") || ((${#files[@]} == 0)); then
		echo "install.sh: no kubelet.service under ${ROOT:-/} (${KL_UNIT_DIRS[*]}): --with-kubelet needs the kubelet's unit" >&2
		return 1
	fi
	cp "$HERE/kubelet/20-cri-shim.conf" "$TMP/20-cri-shim.conf"
	dir=$(kl_config_dir "${files[@]}")
	KL_EXEC=
	if [[ -n $dir ]]; then
		KL_DIR=$dir
		echo "kubelet: it already reads --config-dir=$dir; the endpoint drop-in goes there"
		return 0
	fi
	KL_DIR=$KL_CONFIG_DIR
	exec=$(kl_exec_start "${files[@]}")
	if [[ -z $exec ]]; then
		echo "install.sh: kubelet.service (${files[*]}) has no ExecStart=" >&2
		return 1
	fi
	KL_EXEC="$exec --config-dir=$KL_CONFIG_DIR"
	printf '\n[Service]\n# The kubelet'"'"'s ExecStart= as %s compose it, and --config-dir.\nExecStart=\nExecStart=%s\n' \
		"${files[*]}" "$KL_EXEC" >>"$TMP/20-cri-shim.conf"
	echo "kubelet: ExecStart=$KL_EXEC"
}

# kl_verify: with the drop-in in place, the ExecStart= systemd composes is the
# one written (no later drop-in replaces it).
kl_verify() {
	local files got
	[[ -n $KL_EXEC ]] || return 0
	mapfile -t files < <(kl_unit_files)
	got=$(kl_exec_start "${files[@]}")
	if [[ $got != "$KL_EXEC" ]]; then
		echo "install.sh: a drop-in after $KL_DROPIN replaces the kubelet's ExecStart= (${files[*]}): $got" >&2
		return 1
	fi
}

# kl_flag_warnings: endpoint flags win over configuration files.
kl_flag_warnings() {
	local f
	for f in /var/lib/kubelet/kubeadm-flags.env /etc/default/kubelet /etc/sysconfig/kubelet; do
		if [[ -f $ROOT$f ]] && grep -q -- '--container-runtime-endpoint\|--image-service-endpoint' "$ROOT$f"; then
			echo "WARNING: $f passes --container-runtime-endpoint or --image-service-endpoint, which win over" >&2
			echo "  $KL_DIR/50-cri-shim.conf: remove them from it (kubeadm keeps the endpoint" >&2
			echo "  in the kubelet's config file since v1.27); cri-shim doctor fails until then." >&2
		fi
	done
}
