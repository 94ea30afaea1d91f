package restore

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are named after KEP-5823's kubelet metrics, with the shim's prefix.
type metrics struct {
	restores      *prometheus.CounterVec
	restoreTime   prometheus.Histogram
	restoreStarts *prometheus.CounterVec
	refusals      *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		restores: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_pod_restore_operations_total",
			Help: "RestorePod calls and warm starts served, by result.",
		}, []string{"result"}),
		restoreTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cri_shim_pod_restore_duration_seconds",
			Help:    "Duration of successful RestorePod calls (sandbox and containers created, not started).",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 12),
		}),
		restoreStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_restored_container_starts_total",
			Help: "Starts of containers staged for a restore, by result: restored; failed (the start failed); not_restored (started without the checkpoint: the pod's runtime is not cri-shim's runtime shim; stopped).",
		}, []string{"result"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_checkpoint_restores_refused_total",
			Help: "Restores refused because the checkpoint's CRIU images would give the container more than its spec allows, by the image kind of the first offending field (core: credentials, seccomp, namespaces; mounts; files; seccomp; ...), or because the checkpoint's rootfs changes are (rootfs_diff), or because a pulled checkpoint's archive or manifest is refused (archive).",
		}, []string{"image"}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.restores, m.restoreTime, m.restoreStarts, m.refusals}
}
