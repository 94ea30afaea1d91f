package criu

import "github.com/prometheus/client_golang/prometheus"

// metrics are named after KEP-5823's kubelet metrics, with the shim's prefix.
type metrics struct {
	restores        *prometheus.CounterVec
	restoreTime     prometheus.Histogram
	restoreStarts   *prometheus.CounterVec
	refusals        *prometheus.CounterVec
	warmStarts      *prometheus.CounterVec
	scheduled       *prometheus.CounterVec
	kubeletWarm     *prometheus.CounterVec
	retentionRemove prometheus.Counter
	// admissionRefused counts checkpoints refused before their pause, by
	// reason; admissionWaiting the calls waiting for a capture slot.
	admissionRefused *prometheus.CounterVec
	admissionWaiting prometheus.Gauge
	pulledReserved   prometheus.Gauge
	pulledEvicted    prometheus.Counter
	pulledRefused    prometheus.Counter
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
		warmStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_pod_warm_starts_total",
			Help: "Sandboxes the kubelet asked for with the restore-from annotation, by result.",
		}, []string{"result"}),
		scheduled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_pod_scheduled_checkpoints_total",
			Help: "Checkpoints taken for pods' checkpoint.cri-shim.io/interval schedules, by result.",
		}, []string{"result"}),
		kubeletWarm: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_kubelet_warm_restarts_total",
			Help: "Containers the kubelet restarted in pods asking for warm restarts, by result: restored from the pod's checkpoint, or cold.",
		}, []string{"result"}),
		retentionRemove: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_pod_checkpoints_removed_total",
			Help: "Managed checkpoints removed by retention (max_per_pod, max_bytes_per_namespace, max_total_bytes, a pod's checkpoint.cri-shim.io/keep).",
		}),
		pulledReserved: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cri_shim_pulled_checkpoint_reserved_bytes",
			Help: "Archive bytes reserved by checkpoint pulls in progress under [checkpoint] pull_max_total_bytes.",
		}),
		pulledEvicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_pulled_checkpoints_evicted_total",
			Help: "Pulled checkpoints no pod used, removed to make room for a new pull under [checkpoint] pull_max_total_bytes.",
		}),
		pulledRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_pulled_checkpoint_pulls_refused_total",
			Help: "Checkpoint pulls refused (ResourceExhausted) because [checkpoint] pull_max_total_bytes left no room.",
		}),
		admissionRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_checkpoint_admission_refused_total",
			Help: "CheckpointPod calls refused before anything was paused, by reason: pod_min_gap, max_bytes_per_namespace, max_total_bytes (the estimated size would not fit after retention), max_concurrent_captures (no capture slot within the deadline), estimate (the runtime gave no stats).",
		}, []string{"reason"}),
		admissionWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cri_shim_checkpoint_admission_waiting",
			Help: "CheckpointPod calls waiting for one of [checkpoint] max_concurrent_captures capture slots.",
		}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.restores, m.restoreTime, m.restoreStarts, m.refusals, m.warmStarts, m.scheduled, m.kubeletWarm, m.retentionRemove,
		m.pulledReserved, m.pulledEvicted, m.pulledRefused, m.admissionRefused, m.admissionWaiting}
}
