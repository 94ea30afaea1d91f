package ckptstore

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the store's, with the shim's prefix.
type metrics struct {
	scheduled       *prometheus.CounterVec
	retentionRemove prometheus.Counter
	pulledReserved  prometheus.Gauge
	pulledEvicted   prometheus.Counter
	pulledRefused   prometheus.Counter
	// admissionRefused counts checkpoints refused before their pause, by
	// reason; admissionWaiting the calls waiting for a capture slot.
	admissionRefused *prometheus.CounterVec
	admissionWaiting prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{
		scheduled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_pod_scheduled_checkpoints_total",
			Help: "Checkpoints taken for pods' checkpoint.cri-shim.io/interval schedules, by result.",
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
	return []prometheus.Collector{m.scheduled, m.retentionRemove, m.pulledReserved, m.pulledEvicted, m.pulledRefused, m.admissionRefused, m.admissionWaiting}
}
