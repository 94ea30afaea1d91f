package podstate

// The restart machinery's metrics.

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	latency    prometheus.Histogram
	containers *prometheus.CounterVec
	restarts   prometheus.Counter
	delay      prometheus.Histogram
	problems   prometheus.Counter
	warm       *prometheus.CounterVec
	backlog    prometheus.Counter
}

func newMetrics() *metrics {
	return &metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "cri_shim_pod_restart_duration_seconds", Help: "From the triggering exit to all containers running again (backoff included).",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 12),
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_pod_restarts_total", Help: "In-place pod restarts started by a RestartAllContainers rule.",
		}),
		containers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_container_restarts_total", Help: "Containers started again by cri-shim, by reason (the rule action).",
		}, []string{"reason"}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "cri_shim_restart_backoff_seconds", Help: "Backoff delay (KEP-4603 curve) applied before each restart cri-shim governs.",
			Buckets: []float64{0, 1, 2, 4, 8, 16, 32, 60, 120, 300},
		}),
		problems: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_restart_rule_problems_total", Help: "Malformed restart-rules annotations (the pod runs with plain kubelet behaviour) and unknown restart.cri-shim.io/termination values (graceful applies).",
		}),
		backlog: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_restart_backlog_waits_total", Help: "Restarts that waited for the kubelet to remove exited instances before creating new ones.",
		}),
		warm: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_warm_restarts_total", Help: "Containers of pods asking for warm restarts started again in place, by result: restored from the pod's checkpoint, or cold.",
		}, []string{"result"}),
	}
}

// Collectors are the manager's metrics, for the shim's registry.
func (m *Manager) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.metrics.restarts, m.metrics.delay, m.metrics.problems, m.metrics.latency, m.metrics.containers, m.metrics.warm, m.metrics.backlog}
}
