package podmgmt

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	sent      prometheus.Counter
	dropped   prometheus.Counter
	commands  *prometheus.CounterVec
	connected *prometheus.GaugeVec
	problems  prometheus.Counter
	refused   *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "cri_shim_podmgmt_notifications_sent_total",
			Help: "Container events delivered to orchestrator sidecars."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "cri_shim_podmgmt_notifications_dropped_total",
			Help: "Container events dropped because a pod's queue was full."}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cri_shim_podmgmt_commands_total",
			Help: "Commands received from orchestrator sidecars, by type and result."}, []string{"type", "result"}),
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cri_shim_podmgmt_connected",
			Help: "1 while the pod's channel to its orchestrator is up."}, []string{"namespace", "pod"}),
		problems: prometheus.NewCounter(prometheus.CounterOpts{Name: "cri_shim_podmgmt_annotation_problems_total",
			Help: "Malformed pod-management.cri-shim.io annotations (the pod runs without a channel)."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cri_shim_podmgmt_channel_refused_total",
			Help: "Orchestrator channels the shim refused to open, by reason (host_network: the pod shares the node's network namespace; host_address, bad_address: the runtime reported a pod IP that is not a pod's)."}, []string{"reason"}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.sent, m.dropped, m.commands, m.connected, m.problems, m.refused}
}
