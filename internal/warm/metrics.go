package warm

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the warm starts' and warm restarts', with the shim's prefix.
type metrics struct {
	warmStarts  *prometheus.CounterVec
	kubeletWarm *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		warmStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_pod_warm_starts_total",
			Help: "Sandboxes the kubelet asked for with the restore-from annotation, by result.",
		}, []string{"result"}),
		kubeletWarm: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_kubelet_warm_restarts_total",
			Help: "Containers the kubelet restarted in pods asking for warm restarts, by result: restored from the pod's checkpoint, or cold.",
		}, []string{"result"}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.warmStarts, m.kubeletWarm}
}
