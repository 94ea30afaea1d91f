// Package warm starts the containers of running pods from checkpoints: a
// warm start restores a new pod whose restore-from annotation names a
// checkpoint (for kubelets that do not call RestorePod), rewriting the
// kubelet's CreateContainer calls, and a warm restart restores a restarting
// container of a pod that asks for it from the pod's latest checkpoint,
// whether internal/podstate restarts it in place or the kubelet does. It
// keeps the warm-start records, so a restarted shim goes on with them. The
// restores themselves are internal/restore's; the checkpoints are read from
// the node's store (internal/ckptstore), which is told which ones are in use.
package warm
