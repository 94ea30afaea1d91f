# Sourced by run.sh: the checks on the installed node. Each records PASS or
# FAIL (run.sh: pass, fail) and never exits.

BUSYBOX=docker.io/library/busybox:cri-shim

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
	} >"/etc/kubernetes/manifests/$name.yaml"
}

# running_main POD: the ID of the pod's running main container, via the shim.
running_main() { crictl_shim ps --pod "$(crictl_shim pods --name "$1" --state ready -q | head -n1)" --name '^main$' --state running -q 2>/dev/null | head -n1; }
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
	# A rule that never matches: the shim tracks (and 'cri-shim pods' lists)
	# only pods with rules it admitted, which only a kubelet on its socket
	# creates.
	static_pod vm-probe "    restart-rules.cri-shim.io/main: '[{\"action\":\"RestartAllContainers\",\"exitCodes\":{\"operator\":\"In\",\"values\":[99]}}]'" "trap 'exit 0' TERM; while true; do sleep 1; done"
	local pid cmd
	pid=$(systemctl show -p MainPID --value kubelet.service)
	cmd=$(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null)
	echo "kubelet: $cmd"
	if ! wait_for 180 "vm-probe through the shim" running_main vm-probe; then
		fail kubelet-uses-shim "the static pod does not run through the shim (kubelet: $cmd; /etc/default/kubelet: $(cat /etc/default/kubelet))"
		return
	fi
	if /usr/local/bin/cri-shim pods -o json 2>/dev/null | grep -q 'vm-probe'; then
		pass kubelet-uses-shim
	else
		fail kubelet-uses-shim "the shim does not know vm-probe (kubelet: $cmd; /etc/default/kubelet: $(cat /etc/default/kubelet))"
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
	static_pod vm-count "    cri-shim.io/probe: 'true'" "i=0; while true; do i=\$((i+1)); echo \$i > /work/n; sleep 1; done"
	local id t0=$SECONDS
	wait_for 180 "vm-count running" running_main vm-count || { fail checkpoint-restore "vm-count did not start"; return; }
	sleep 5
	if ! /usr/local/bin/cri-shim checkpoint --pod vm-count --name vm-count-cp --timeout 5m >"$OUT/checkpoint.log" 2>&1; then
		fail checkpoint-restore "CheckpointPod: $(tail -n 3 "$OUT/checkpoint.log" | tr '\n' ' ')"
		return
	fi
	id=$(running_main vm-count)
	local at
	at=$(crictl_shim exec "$id" cat /work/n 2>&1)
	rm -f /etc/kubernetes/manifests/vm-count.yaml
	static_pod vm-restored "    checkpoint.cri-shim.io/restore-from: vm-count-cp" "echo restarted > /work/cold; i=0; while true; do i=\$((i+1)); echo \$i > /work/n; sleep 1; done"
	if ! wait_for 300 "vm-restored running" running_main vm-restored; then
		fail checkpoint-restore "the restored pod does not run ($(journalctl -u cri-shim --no-pager | grep -i restor | tail -n 3 | tr '\n' ' '))"
		return
	fi
	sleep 3
	id=$(running_main vm-restored)
	local n cold
	n=$(crictl_shim exec "$id" cat /work/n 2>&1)
	cold=$(crictl_shim exec "$id" cat /work/cold 2>/dev/null)
	echo "checkpoint at n=$at; restored pod at n=$n; cold start marker: '${cold}'"
	if [[ -z $cold && $n =~ ^[0-9]+$ && $at =~ ^[0-9]+$ && $n -ge $at ]]; then
		pass checkpoint-restore
	else
		fail checkpoint-restore "restored n=$n after checkpoint n=$at, cold-start marker '$cold' (want none: the process counts on)"
	fi
	rm -f /etc/kubernetes/manifests/vm-restored.yaml
}
