# Sourced by run.sh: the checks on the installed node. Each records PASS or
# FAIL (run.sh: pass, fail) and never exits.

BUSYBOX=docker.io/library/busybox:cri-shim

# config_only_runtime_path BEFORE AFTER: two `containerd config dump`s
# differ in the runc handler's runtime_path only, which is cri-shim's runtime
# shim in AFTER. On failure sets CHECK_WHY and returns 1.
config_only_runtime_path() {
	local changed
	changed=$(diff "$1" "$2" | grep '^[<>]' | grep -v 'runtime_path' || true)
	if [[ -n $changed ]]; then
		CHECK_WHY="other settings changed: $(echo "$changed" | sed -n '1,5p' | tr '\n' ' ')"
		return 1
	fi
	if ! grep -Eq "runtime_path = ['\"]/usr/local/bin/containerd-shim-cri-shim-v2['\"]" "$2"; then
		CHECK_WHY="the runc handler's runtime_path is not cri-shim's runtime shim: the drop-in was not read"
		return 1
	fi
}

# static_pod NAME ANNOTATIONS MAIN_SCRIPT [INIT_SCRIPT]: a static pod with
# an emptyDir at /work, restartPolicy Never.
static_pod() {
	local name=$1 ann=$2 main=$3 init=${4:-}
	{
		printf 'apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\n  namespace: default\n  annotations:\n%s\n' "$name" "$ann"
		printf 'spec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 2\n'
		if [[ -n $init ]]; then
			printf '  initContainers:\n  - name: init\n    image: %s\n    imagePullPolicy: Never\n    command: ["sh", "-c", %s]\n    volumeMounts: [{name: work, mountPath: /work}]\n' "$BUSYBOX" "$(printf '%s' "$init" | sed 's/"/\\"/g; s/^/"/; s/$/"/')"
		fi
		printf '  containers:\n  - name: main\n    image: %s\n    imagePullPolicy: Never\n    command: ["sh", "-c", %s]\n    volumeMounts: [{name: work, mountPath: /work}]\n' "$BUSYBOX" "$(printf '%s' "$main" | sed 's/"/\\"/g; s/^/"/; s/$/"/')"
		printf '  volumes:\n  - name: work\n    emptyDir: {}\n'
	} >"/etc/kubernetes/.$name.yaml"
	# Whole, in one rename: the kubelet reads a manifest being written.
	mv "/etc/kubernetes/.$name.yaml" "/etc/kubernetes/manifests/$name.yaml"
}

# running_main POD: the ID of the pod's running main container, via the shim.
running_main() {
	local sb
	sb=$(crictl_shim pods --name "^$1-" --state ready -q 2>/dev/null | sed -n 1p)
	[[ -n $sb ]] || return 1 # an empty --pod would match every pod's main
	crictl_shim ps --pod "$sb" --name '^main$' --state running -q 2>/dev/null | sed -n 1p | grep .
}
attempt_of() { crictl_shim inspect -o go-template --template '{{.status.metadata.attempt}}' "$1" 2>/dev/null; }

check_socket_activated() {
	local why=
	systemctl -q is-enabled cri-shim.socket || why+="cri-shim.socket not enabled; "
	systemctl -q is-active cri-shim.socket || why+="cri-shim.socket not active; "
	systemctl -q is-active cri-shim.service || why+="cri-shim.service not active; "
	[[ $(systemctl show -p TriggeredBy --value cri-shim.service) == *cri-shim.socket* ]] || why+="cri-shim.service not triggered by its socket; "
	[[ $(stat -c %a /run/cri-shim/cri-shim.sock 2>/dev/null) == 660 ]] || why+="socket mode $(stat -c %a /run/cri-shim/cri-shim.sock 2>&1); "
	[[ -z $why ]] && pass socket-activated-unit || fail socket-activated-unit "$why"
}

check_kubelet_on_shim() {
	# A rule that never matches: 'cri-shim pods' (out/pods.json) lists the
	# pods with rules the shim admitted.
	static_pod vm-probe "    restart-rules.cri-shim.io/main: '[{\"action\":\"RestartAllContainers\",\"exitCodes\":{\"operator\":\"In\",\"values\":[99]}}]'" "trap 'exit 0' TERM; while true; do sleep 1; done"
	local pid cmd
	pid=$(systemctl show -p MainPID --value kubelet.service)
	cmd=$(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null)
	echo "kubelet: $cmd"
	if ! wait_for 180 "vm-probe through the shim" running_main vm-probe; then
		fail kubelet-uses-shim "the static pod does not run through the shim (kubelet: $cmd; /etc/default/kubelet: $(cat /etc/default/kubelet))"
		return
	fi
	# What an operator runs: doctor reads the running kubelet's command line
	# and the configuration files it names.
	/usr/local/bin/cri-shim doctor >"$OUT/doctor.txt" 2>&1
	/usr/local/bin/cri-shim pods -o json >"$OUT/pods.json" 2>&1
	local doc
	if doc=$(/usr/local/bin/cri-shim doctor --only kubelet 2>&1); then
		pass kubelet-uses-shim
	else
		fail kubelet-uses-shim "doctor: $(echo "$doc" | tr '\n' ' ' | cut -c1-300) (kubelet: $cmd)"
	fi
	rm -f /etc/kubernetes/manifests/vm-probe.yaml
}

# The whole pod restarts in place when main exits 88: same sandbox, init ran
# again, main's next instance is attempt 1.
check_inplace_restart() {
	local rule='[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[88]}}]'
	static_pod vm-restart "    restart-rules.cri-shim.io/main: '$rule'" \
		"echo run >> /work/main.log; if [ \$(grep -c run /work/main.log) -le 1 ]; then sleep 2; exit 88; fi; trap 'exit 0' TERM; while true; do sleep 1; done" \
		"echo run >> /work/init.log"
	local t0=$SECONDS id= sb
	until id=$(running_main vm-restart) && [[ -n $id && $(attempt_of "$id") == 1 ]]; do
		if ((SECONDS - t0 > 240)); then
			fail inplace-restart "main not running as attempt 1 within 240 s ($(crictl_shim ps -a --name main 2>&1 | tail -n 3 | tr '\n' ' '))"
			return
		fi
		sleep 2
	done
	local sandboxes inits mains
	sandboxes=$(crictl_shim pods --name vm-restart -q | wc -l)
	inits=$(crictl_shim exec "$id" grep -c run /work/init.log 2>&1)
	mains=$(crictl_shim exec "$id" grep -c run /work/main.log 2>&1)
	if [[ $sandboxes == 1 && $inits == 2 && $mains == 2 ]]; then
		pass inplace-restart
		echo "in-place restart: main attempt 1 after $((SECONDS - t0)) s, one sandbox, init ran twice"
	else
		fail inplace-restart "sandboxes $sandboxes (want 1), init ran $inits (want 2), main ran $mains (want 2)"
	fi
	rm -f /etc/kubernetes/manifests/vm-restart.yaml
}

# KEP-4603's curve: a pod whose main exits 1 at once and restarts in place
# (rule: Restart on any non-zero exit) waits at least 1, 2, 4, 8 s between
# runs (the delay starts at the exit; a start under TCG adds seconds).
check_backoff_curve() {
	local rule='[{"action":"RestartAllContainers","exitCodes":{"operator":"NotIn","values":[0]}}]'
	static_pod vm-backoff "    restart-rules.cri-shim.io/main: '$rule'" \
		"date +%s >> /work/starts; if [ \$(wc -l < /work/starts) -ge 6 ]; then trap 'exit 0' TERM; while true; do sleep 1; done; fi; exit 1"
	local t0=$SECONDS id=
	until id=$(running_main vm-backoff) && [[ -n $id && $(attempt_of "$id") -ge 5 ]]; do
		if ((SECONDS - t0 > 300)); then
			fail backoff-curve "main not at attempt 5 within 300 s"
			return
		fi
		sleep 2
	done
	local starts gaps=() prev= why=
	starts=$(crictl_shim exec "$id" cat /work/starts 2>&1)
	for s in $starts; do
		[[ -n $prev ]] && gaps+=($((s - prev)))
		prev=$s
	done
	echo "backoff: gaps between runs ${gaps[*]} s"
	local want=(1 2 4 8)
	for i in 0 1 2 3; do
		[[ ${gaps[i]:-0} -ge ${want[i]} ]] || why+="gap $((i + 1)) ${gaps[i]:-none} s < ${want[i]} s; "
		[[ ${gaps[i]:-999} -le $((want[i] + 20)) ]] || why+="gap $((i + 1)) ${gaps[i]} s > ${want[i]} + 20 s; "
	done
	[[ -z $why ]] && pass backoff-curve || fail backoff-curve "$why (gaps ${gaps[*]})"
	rm -f /etc/kubernetes/manifests/vm-backoff.yaml
}

# CheckpointPod of a counting pod, then a new pod restored from it that
# counts on from where the checkpoint was taken.
check_checkpoint_restore() {
	counting_checkpoint vm-count vm-count-cp || { fail checkpoint-restore "$CHECK_WHY"; return; }
	restored_counts vm-restored vm-count-cp "$CP_AT" || { fail checkpoint-restore "$CHECK_WHY"; return; }
	pass checkpoint-restore
	rm -f /etc/kubernetes/manifests/vm-restored.yaml
}

# COUNTER counts once a second into /work/n, written whole (a rename: a
# reader never sees the file truncated and not yet written).
COUNTER='i=0; while true; do i=$((i+1)); echo $i > /work/n.new; mv /work/n.new /work/n; sleep 1; done'

# counting_checkpoint POD NAME: a static pod POD whose main counts once a
# second into /work/n, then CheckpointPod of it named NAME. Sets CP_AT to
# the count read right before the checkpoint (the checkpoint's own count is
# at least that; the pod counts on while it is taken, so a count read after
# it can be higher than the checkpoint's) and removes the pod; on failure
# sets CHECK_WHY and returns 1.
counting_checkpoint() {
	local pod=$1 cp=$2 id after
	static_pod "$pod" "    cri-shim.io/probe: 'true'" "$COUNTER"
	wait_for 180 "$pod running" running_main "$pod" || { CHECK_WHY="$pod did not start"; return 1; }
	sleep 5
	id=$(running_main "$pod")
	CP_AT=$(crictl_shim exec "$id" cat /work/n 2>&1)
	# A static pod's name carries the node's: POD-<hostname>.
	if ! /usr/local/bin/cri-shim checkpoint --pod "$pod-$(hostname)" --name "$cp" --timeout 5m >"$OUT/checkpoint.log" 2>&1; then
		CHECK_WHY="CheckpointPod: $(tail -n 3 "$OUT/checkpoint.log" | tr '\n' ' ')"
		return 1
	fi
	after=$(crictl_shim exec "$id" cat /work/n 2>&1)
	echo "checkpoint $cp of $pod: n=$CP_AT before it, n=$after after it"
	rm -f "/etc/kubernetes/manifests/$pod.yaml"
}

# restored_counts POD NAME AT: a static pod POD restored from the checkpoint
# NAME (annotation checkpoint.cri-shim.io/restore-from) runs, its process
# counts on from the checkpoint's count (at least AT, a count read before
# the checkpoint, and still counting seconds later) and never started cold
# (a cold start writes /work/cold).
# On failure sets CHECK_WHY and returns 1. The pod stays. RESTORE_WAIT
# bounds the wait for it to run (seconds, default 300).
restored_counts() {
	local pod=$1 cp=$2 at=$3 id n n2 cold
	static_pod "$pod" "    checkpoint.cri-shim.io/restore-from: $cp" "echo restarted > /work/cold; $COUNTER"
	if ! wait_for "${RESTORE_WAIT:-300}" "$pod running" running_main "$pod"; then
		CHECK_WHY="the restored pod does not run ($(journalctl -u cri-shim --no-pager | grep -i restor | tail -n 3 | tr '\n' ' '))"
		return 1
	fi
	sleep 3
	if ! id=$(running_main "$pod"); then
		local last
		last=$(crictl_shim ps -a --name '^main$' -q 2>/dev/null | sed -n 1p)
		CHECK_WHY="the restored main ran, then stopped: $(crictl_shim inspect -o go-template --template '{{.status.state}} exit {{.status.exitCode}} {{.status.reason}} {{.status.message}}' "$last" 2>&1 | head -c 300)"
		return 1
	fi
	n=$(crictl_shim exec "$id" cat /work/n 2>&1)
	cold=$(crictl_shim exec "$id" cat /work/cold 2>/dev/null)
	sleep 3
	n2=$(crictl_shim exec "$id" cat /work/n 2>&1)
	echo "checkpoint at n=$at; restored pod at n=$n, then $n2; cold start marker: '${cold}'"
	if [[ -z $cold && $n =~ ^[0-9]+$ && $n2 =~ ^[0-9]+$ && $at =~ ^[0-9]+$ && $n -ge $at && $n2 -gt $n ]]; then
		return 0
	fi
	CHECK_WHY="restored n=$n then $n2 after checkpoint n=$at, cold-start marker '$cold' (want none: the process counts on)"
	return 1
}

# An upgrade in place (install.sh with another binary, systemctl reload:
# the new binary exec'd in the running process) while a pod crash-loops
# through in-place restarts: the new version answers, the pod goes on
# restarting and never fails, and the kubelet logs no CRI call that failed
# to reach the shim (a refused create during a restart is the product's
# answer, not a lost call).
check_upgrade_under_crash_loop() {
	local rule='[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[1]}}]'
	static_pod vm-crash "    restart-rules.cri-shim.io/main: '$rule'" "sleep 1; exit 1"
	local t0=$SECONDS id=
	until id=$(running_main vm-crash) && [[ $(attempt_of "$id") -ge 2 ]]; do
		((SECONDS - t0 > 240)) && { fail upgrade-under-crash-loop "vm-crash not at attempt 2 within 240 s"; return; }
		sleep 1
	done
	local since before after why=
	since=$(date '+%Y-%m-%d %H:%M:%S')
	before=$(/usr/local/bin/cri-shim version | sed -n 1p)
	if ! "$P/repo/deploy/install.sh" --binary "$P/repo/_output/cri-shim-upgrade" >"$OUT/upgrade.log" 2>&1; then
		fail upgrade-under-crash-loop "install.sh (upgrade) exit $?: $(tail -n 3 "$OUT/upgrade.log" | tr '\n' ' ')"
		return
	fi
	after=$(/usr/local/bin/cri-shim version | sed -n 1p)
	[[ $after == *vm-upgrade* ]] || why+="version after the upgrade: $after; "
	local a0 a1
	a0=$(attempt_of "$(running_main vm-crash)")
	t0=$SECONDS
	until id=$(running_main vm-crash) && a1=$(attempt_of "$id") && ((a1 >= a0 + 2)); do
		((SECONDS - t0 > 240)) && { why+="no restart after the upgrade within 240 s (attempt ${a0:-?}); "; break; }
		sleep 1
	done
	local failed
	failed=$(journalctl -u kubelet --since "$since" --no-pager | grep -E 'connection refused|transport is closing|error reading from server|connection reset|no such file or directory.*cri-shim.sock' | sed -n '1,3p')
	[[ -z $failed ]] || why+="kubelet saw failed CRI calls: $failed; "
	crictl_shim pods --name '^vm-crash-' --state notready -q | grep -q . && why+="vm-crash has a not-ready sandbox; "
	echo "upgrade: $before -> $after; vm-crash attempt $a0 -> ${a1:-?}"
	[[ -z $why ]] && pass upgrade-under-crash-loop || fail upgrade-under-crash-loop "$why"
	rm -f /etc/kubernetes/manifests/vm-crash.yaml
}

# install.sh --uninstall puts the node back: every file under /etc as it
# was before the install, containerd's effective config as before, the
# kubelet back on containerd, no cri-shim unit enabled.
check_uninstall() {
	wait_for 120 "the static pods gone" bash -c '! crictl --runtime-endpoint unix:///run/containerd/containerd.sock pods --state ready -q | grep -q .' 
	if ! "$P/repo/deploy/install.sh" --uninstall >"$OUT/uninstall.log" 2>&1; then
		fail uninstall "exit $?: $(tail -n 3 "$OUT/uninstall.log" | tr '\n' ' ')"
		return
	fi
	local why= changed
	# /etc/mtab links to /proc/self/mounts: its content is the mounts of the moment.
	find /etc -xdev -type f -o -type l | sort | xargs -d '\n' sha256sum 2>/dev/null >"$OUT/etc-after-uninstall.sha"
	changed=$(diff "$OUT/etc-before.sha" "$OUT/etc-after-uninstall.sha" | grep '^[<>]' | grep -v -E ' /etc/(kubernetes/\.|ld\.so\.cache|mtab$)' || true)
	[[ -z $changed ]] || why+="/etc differs: $(echo "$changed" | sed -n '1,6p' | tr '\n' ' '); "
	containerd config dump >"$OUT/containerd-after-uninstall.toml" 2>/dev/null
	diff -q "$OUT/containerd-before.toml" "$OUT/containerd-after-uninstall.toml" >/dev/null || why+="containerd's effective config differs from before; "
	systemctl -q is-enabled cri-shim.socket 2>/dev/null && why+="cri-shim.socket still enabled; "
	systemctl -q is-active cri-shim.service 2>/dev/null && why+="cri-shim.service still active; "
	local pid
	pid=$(systemctl show -p MainPID --value kubelet.service)
	grep -q -- '--config-dir' /proc/"$pid"/cmdline 2>/dev/null && why+="the kubelet still has --config-dir; "
	wait_for 60 "the kubelet healthy on containerd" bash -c 'exec 3<>/dev/tcp/127.0.0.1/10248 && printf "GET /healthz HTTP/1.0\r\n\r\n" >&3 && grep -q ok <&3' || why+="the kubelet is not healthy after the uninstall; "
	[[ -z $why ]] && pass uninstall || fail uninstall "$why"
}
