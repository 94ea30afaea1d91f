package podstatus

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/kubeapi"
)

// KubeletFeatureRestartAll is the node-declared feature of a kubelet whose
// RestartAllContainersOnContainerExits gate is on
// (k8s.io/component-helpers/nodedeclaredfeatures/features/restartallcontainers).
// That kubelet owns the AllContainersRestarting condition: it is in its
// list of kubelet conditions (pkg/kubelet/types/pod_status.go,
// PodConditionByKubelet), so its status manager drops any other writer's
// value on its next write (pkg/kubelet/status/status_manager.go,
// mergePodStatus), and a True value would tell it a restart of its own is
// under way (pkg/kubelet/container/helpers.go, ShouldAllContainersRestart).
const KubeletFeatureRestartAll = "RestartAllContainersOnContainerExits"

// firstOwningKubelet is the first kubelet minor that can own
// AllContainersRestarting: v1.34's PodConditionByKubelet has no such
// condition (kubernetes v1.34.4 pkg/kubelet/types/pod_status.go), and its
// Node type has no declaredFeatures, so a value there was written by an
// earlier kubelet on the node and is left as it was (the kubelet patches
// only what it changes).
var firstOwningKubelet = version.MajorMinor(1, 35)

// kubeletOwns is whether the node's kubelet owns AllContainersRestarting: it
// declares the feature, and its version can have it. A version that does
// not parse leaves the declared features to decide.
func kubeletOwns(declared []string, kubeletVersion string) bool {
	if !slices.Contains(declared, KubeletFeatureRestartAll) {
		return false
	}
	v, err := version.ParseGeneric(kubeletVersion)
	return err != nil || !v.LessThan(firstOwningKubelet)
}

// How often the node's declared features are read: the kubelet declares
// them at its start, so they change only when it restarts.
const (
	ownerRefresh = 10 * time.Minute
	// ownerRetry is the first wait before a failed read of the node is
	// tried again while its answer is not known (backoff.Retry from there,
	// up to ownerRefresh).
	ownerRetry = time.Second
)

// ownerCheck knows whether the kubelet owns AllContainersRestarting, from
// the node's status.declaredFeatures.
type ownerCheck struct {
	c     *kubeapi.Client
	log   *slog.Logger
	state atomic.Int32 // ownerUnknown, ownerKubelet, ownerShim
	// known is called once the first answer is in (with it).
	known func(owner int32)
}

const (
	ownerUnknown int32 = iota
	ownerKubelet
	ownerShim
)

func newOwnerCheck(c *kubeapi.Client, log *slog.Logger) *ownerCheck {
	return &ownerCheck{c: c, log: log}
}

func (o *ownerCheck) run(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-o.c.Ready():
	}
	retry := backoff.Retry(ownerRetry, ownerRefresh)
	for {
		wait := ownerRefresh
		if err := o.check(ctx); err != nil {
			if o.state.Load() == ownerUnknown {
				wait = retry.Step()
			}
			o.log.Debug("podstatus: reading the node's declared features", "err", err)
		} else {
			retry = backoff.Retry(ownerRetry, ownerRefresh)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (o *ownerCheck) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	n, err := o.c.Resources().GetNode(ctx, o.c.Node)
	if err != nil {
		return err
	}
	owned := kubeletOwns(n.Status.DeclaredFeatures, n.Status.NodeInfo.KubeletVersion)
	next := ownerShim
	if owned {
		next = ownerKubelet
	}
	if prev := o.state.Swap(next); prev != next {
		if prev == ownerUnknown && o.known != nil {
			o.known(next)
		}
		if owned {
			o.log.Info("podstatus: the kubelet declares " + KubeletFeatureRestartAll + " and owns the AllContainersRestarting condition; the shim writes only its readiness gate " + string(ReadyCondition))
		} else {
			o.log.Info("podstatus: the kubelet does not own AllContainersRestarting; the shim writes it during in-place restarts")
		}
	}
	return nil
}
