package capture

import "github.com/prometheus/client_golang/prometheus"

// metrics are named after KEP-5823's kubelet metrics, with the shim's prefix.
type metrics struct {
	checkpoints    *prometheus.CounterVec
	checkpointTime prometheus.Histogram
	checkpointSize prometheus.Histogram
	frozen         prometheus.Histogram
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
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.checkpoints, m.checkpointTime, m.checkpointSize, m.frozen}
}
