package capture

import "github.com/prometheus/client_golang/prometheus"

// metrics are named after KEP-5823's kubelet metrics, with the shim's prefix.
type metrics struct {
	checkpoints    *prometheus.CounterVec
	checkpointTime prometheus.Histogram
	checkpointSize prometheus.Histogram
	frozen         prometheus.Histogram
	freezePhase    *prometheus.HistogramVec
}

func newMetrics() *metrics {
	return &metrics{
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_pod_checkpoint_operations_total",
			Help: "CheckpointPod calls served, by result (success, or the gRPC code of the failure).",
		}, []string{"result"}),
		checkpointTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cri_shim_pod_checkpoint_duration_seconds",
			Help:    "Duration of successful CheckpointPod calls.",
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 12),
		}),
		checkpointSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cri_shim_pod_checkpoint_size_bytes",
			Help:    "Size of the pod checkpoints written.",
			Buckets: prometheus.ExponentialBuckets(1<<20, 4, 10),
		}),
		frozen: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cri_shim_pod_checkpoint_frozen_seconds",
			Help:    "How long the pod's containers stayed paused for one checkpoint.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 12),
		}),
		freezePhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cri_shim_pod_checkpoint_frozen_phase_seconds",
			Help:    "The spans of a checkpoint's freeze: pause (until every container is paused), capture (until every capture ended), resume (until every container runs).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"phase"}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.checkpoints, m.checkpointTime, m.checkpointSize, m.frozen, m.freezePhase}
}
