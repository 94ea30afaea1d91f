#!/usr/bin/env bash
# The demo `make run` ends with, on a running node (up.sh --kubelet, with
# deploy/examples/demo/cri-shim.toml in the shim's config): places the pods of
# deploy/examples/demo/ as static pods, takes a checkpoint of demo-counter with
# `cri-shim checkpoint` and warm-starts demo-warm from it, sends the example
# orchestrator one command, and prints for each feature the one command that
# shows it working. TestDemo (test/e2e) runs this script and every command it
# prints, so what it shows cannot rot unnoticed.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
export PATH=$STACK/bin:$PATH
log() { printf '[demo] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
[[ -f $NODE_RUN/env ]] || die "no node running (no $NODE_RUN/env): run test/stack/up.sh --kubelet first"
DEMO=$REPO/deploy/examples/demo
SHIM_CONFIG=$NODE_RUN/cri-shim/config.toml
CRICTL="$STACK/bin/crictl --config $NODE_RUN/crictl.yaml"
ORCH=$NODE_DATA/demo/orchestrator
CP=demo-counter-warm
pod() { echo "$1-$NODE_NAME"; } # a static pod's name as the kubelet reports it

wait_for() { # wait_for SECONDS DESC CMD...
	local t=$1 what=$2; shift 2
	local deadline=$((SECONDS + t))
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || die "timed out after ${t}s waiting for $what (kubelet log: $NODE_RUN/kubelet.log, shim log: $NODE_RUN/cri-shim.log)"
		sleep 0.5
	done
}
running() { # running POD CONTAINER
	$CRICTL ps --state running --name "^$2\$" --label "io.kubernetes.pod.name=$(pod "$1")" -q | grep -q .
}
log_has() { # log_has POD CONTAINER REGEX: in the kubelet's logs of the container's instances kept
	local f
	f=$(compgen -G "$NODE_DATA/pod-logs/default_$(pod "$1")_*/$2/*.log") && grep -Eqh "$3" $f
}
place() { # place NAME: deploy/examples/demo/NAME.yaml as the static pod demo-NAME
	sed "s#/var/lib/cri-shim-node/#$NODE_DATA/#g" "$DEMO/$1.yaml" >"$MANIFESTS/demo-$1.yaml"
}

# The orchestrator sidecar is examples/orchestrator, static (busybox image, no libc).
log "building examples/orchestrator"
mkdir -p "$ORCH"
rm -f "$ORCH/commands" "$ORCH/commands.done"
(cd "$REPO" && CGO_ENABLED=0 "${GO:-go}" build -o "$ORCH/orchestrator" ./examples/orchestrator)
rm -rf "${CHECKPOINTS:-$NODE_DATA/checkpoints}/$CP" "$MANIFESTS/demo-warm.yaml"
for m in restart crashloop counter orchestrator; do place "$m"; done
log "demo pods placed in $MANIFESTS; waiting for them"

wait_for 120 "demo-counter to count" log_has demo-counter main 'count 3 '
log "checkpointing demo-counter into $CP"
"$SHIM_BIN" checkpoint --config "$SHIM_CONFIG" --namespace default --pod "$(pod demo-counter)" --name "$CP" --timeout 60s
place warm
wait_for 120 "demo-warm to run from the checkpoint" running demo-warm main

wait_for 120 "the orchestrator to see worker start" log_has demo-orchestrator orchestrator 'container=worker type=STARTED'
echo "restart worker" >>"$ORCH/commands"
wait_for 60 "the orchestrator's restart of worker" log_has demo-orchestrator orchestrator 'container=worker type=STARTED .*restarts=1'
wait_for 60 "demo-restart to run" running demo-restart main
wait_for 60 "demo-crashloop to crash under the curve" log_has demo-crashloop crash 'failing'

# With the shim acting as the node in the API ([kubernetes]; make run): the
# readiness gate, the events and a PodCheckpoint, on API pods (the stack has
# no scheduler: demo.sh binds them to this node).
API=
if grep -q '^\[kubernetes\]' "$SHIM_CONFIG" && [[ -f $ADMIN_KUBECONFIG && -f $NODE_RUN/kube-apiserver.pid ]]; then API=1; fi
KUBECTL="$STACK/bin/kubectl --kubeconfig $ADMIN_KUBECONFIG -n cri-shim-demo"
api_log_has() { # api_log_has POD REGEX: in the kubelet's log of the API pod's main
	local f
	f=$(compgen -G "$NODE_DATA/pod-logs/cri-shim-demo_$1_*/main/*.log") && grep -Eqh "$2" $f
}
api_place() { sed "s#NODE_NAME#$NODE_NAME#" "$DEMO/api/$1.yaml" | $KUBECTL apply -f - >/dev/null; }
if [[ -n $API ]]; then
	log "the API side: demo-api-restart, and a PodCheckpoint of demo-api-counter restored by name"
	$KUBECTL apply -f "$DEMO/api/namespace.yaml" >/dev/null
	$KUBECTL delete pod demo-api-restart demo-api-counter demo-api-warm --ignore-not-found --wait=true >/dev/null
	$KUBECTL delete podcheckpoint demo-api-counter-cp --ignore-not-found --wait=true >/dev/null
	api_place restart
	api_place counter
	wait_for 120 "demo-api-counter to count" api_log_has demo-api-counter 'count 3 '
	$KUBECTL apply -f "$DEMO/api/podcheckpoint.yaml" >/dev/null
	wait_for 120 "PodCheckpoint demo-api-counter-cp to be Ready" $KUBECTL wait --for=condition=Ready --timeout=1s podcheckpoint/demo-api-counter-cp
	api_place warm
	wait_for 120 "demo-api-warm to run from the PodCheckpoint" sh -c "$KUBECTL get pod demo-api-warm -o jsonpath='{.status.phase}' | grep -q Running"
fi

LOGS=$NODE_DATA/pod-logs
cat <<TXT

=== cri-shim node is up, with the demo ===
containerd : $CONTAINERD_SOCK
cri-shim   : $SHIM_SOCK   (config: $SHIM_CONFIG, logs: $NODE_RUN/cri-shim.log)
kubelet    : https://127.0.0.1:$KUBELET_PORT   (logs: $NODE_RUN/kubelet.log)
TXT
if [[ -f $ADMIN_KUBECONFIG && -f $NODE_RUN/kube-apiserver.pid ]]; then
	echo "API server : https://127.0.0.1:$APISERVER_PORT   (logs: $NODE_RUN/kube-apiserver.log)"
fi
cat <<TXT

Each feature, and the one command that shows it working:

1. In-place pod restart: demo-restart's main exits 88 about once a minute and its
   RestartAllContainers rule restarts the whole pod where it is: init, sidecar
   and main start again (ATTEMPT goes up) in the same sandbox (one POD ID).
   $ $CRICTL ps -a --label io.kubernetes.pod.name=$(pod demo-restart)

2. Restart backoff: demo-crashloop's container fails at once, every time; its
   Restart rule puts it on the shim's curve (1 s doubling, node cap 5 s here)
   instead of the kubelet's CrashLoopBackOff (10 s doubling to 5 min). See its
   restart count, last exit, current delay and next restart:
   $ $SHIM_BIN pods --config $SHIM_CONFIG

3. Checkpoint and warm start: the demo ran
     $SHIM_BIN checkpoint --config $SHIM_CONFIG --namespace default --pod $(pod demo-counter) --name $CP
   and started demo-warm annotated checkpoint.cri-shim.io/restore-from: $CP. Its
   main is the checkpointed process (its log starts with the source's lines):
   the last line it printed in demo-counter, then the first in demo-warm, one
   count on, with the source's start time:
   $ grep -h -B 1 -m 1 "in $(pod demo-warm)" $LOGS/default_$(pod demo-warm)_*/main/0.log

4. Orchestrator sidecar: cri-shim sends demo-orchestrator's sidecar every
   container event and carried out its command "restart worker":
   $ tail -n 4 $LOGS/default_$(pod demo-orchestrator)_*/orchestrator/0.log
   try: echo "restart-all demo" >> $ORCH/commands   (or "restart worker", "terminate worker 3")

TXT
if [[ -n $API ]]; then
	cat <<TXT
5. The API side, the shim acting as the node (docs/kubernetes-api.md): demo-api-restart's
   main exits 88 every 20 s. cri-shim's readiness gate (restart.cri-shim.io/ready, added
   by deploy/admission) keeps the pod not Ready while the restart is held by the backoff
   (reason BackoffHold), and Ready again once it runs. Run it a few times:
   $ $KUBECTL get pod demo-api-restart -o custom-columns='NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,GATE:.status.conditions[?(@.type=="restart.cri-shim.io/ready")].status,REASON:.status.conditions[?(@.type=="restart.cri-shim.io/ready")].reason'

6. The restart's events, written by cri-shim:
   $ $KUBECTL get events --field-selector involvedObject.name=demo-api-restart

7. A PodCheckpoint made with kubectl apply (deploy/examples/demo/api/podcheckpoint.yaml):
   the node running demo-api-counter checkpointed it and reports it Ready:
   $ $KUBECTL get podcheckpoint demo-api-counter-cp

8. demo-api-warm names it (checkpoint.cri-shim.io/restore-from: demo-api-counter-cp) and
   runs as the checkpointed process, one count on:
   $ grep -h -B 1 -m 1 "in demo-api-warm" $LOGS/cri-shim-demo_demo-api-warm_*/main/0.log

TXT
fi
cat <<TXT
More:
   $CRICTL pods   # every pod, through the shim
   curl -sk https://127.0.0.1:$KUBELET_PORT/pods | head -c 600   # the kubelet's view
TXT
if [[ -f $ADMIN_KUBECONFIG && -f $NODE_RUN/kube-apiserver.pid ]]; then
	echo "   $STACK/bin/kubectl --kubeconfig $ADMIN_KUBECONFIG get nodes,pods -A -o wide   # the API's view"
fi
cat <<TXT
   curl -s http://$SHIM_METRICS/metrics | grep ^cri_shim_   # the shim's metrics
   curl -s http://$SHIM_METRICS/readyz
Stop it: make stop
TXT
