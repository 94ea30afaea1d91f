// Package metrics holds the shim's Prometheus instruments. Per-method series are
// resolved once at start-up so that recording a call on the hot path is a few
// atomic adds: no map lookup under a lock, no label hashing, no allocation.
package metrics

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// OtherMethod is the label used for methods this build does not know, so a
// client cannot grow the series count without bound.
const OtherMethod = "other"

// Collector owns the registry and the per-method instruments.
type Collector struct {
	Registry *prometheus.Registry

	requests *prometheus.CounterVec
	errors   *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	streams  *prometheus.GaugeVec

	backendUp prometheus.Gauge

	methods map[string]*Method
	other   *Method
}

// Method records calls of one gRPC method.
type Method struct {
	name     string
	requests prometheus.Counter
	latency  prometheus.Observer
	streams  prometheus.Gauge
	errVec   *prometheus.CounterVec
	// errs is filled lazily so that only codes that actually occurred export a series.
	errs [codes.Unauthenticated + 1]atomic.Pointer[prometheus.Counter]
}

// New builds a collector with series for every method in fullMethods
// ("/package.Service/Method"), plus the Go runtime and process collectors.
func New(fullMethods []string) *Collector {
	c := &Collector{
		Registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_grpc_requests_total",
			Help: "CRI calls received by the shim, by method.",
		}, []string{"method"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_grpc_errors_total",
			Help: "CRI calls that ended with a non-OK status, by method and gRPC code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cri_shim_grpc_request_duration_seconds",
			Help:    "Time from receiving a CRI call to its status, by method (whole stream lifetime for streams).",
			Buckets: prometheus.ExponentialBucketsRange(0.00005, 60, 16),
		}, []string{"method"}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cri_shim_grpc_streams_in_flight",
			Help: "Streaming CRI calls currently open through the shim, by method.",
		}, []string{"method"}),
		backendUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cri_shim_runtime_up",
			Help: "1 when the last readiness probe of the runtime endpoint succeeded, else 0.",
		}),
		methods: make(map[string]*Method, len(fullMethods)),
	}
	c.Registry.MustRegister(c.requests, c.errors, c.latency, c.streams, c.backendUp,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, fm := range fullMethods {
		c.methods[fm] = c.newMethod(strings.TrimPrefix(fm, "/"))
	}
	c.other = c.newMethod(OtherMethod)
	return c
}

func (c *Collector) newMethod(label string) *Method {
	return &Method{
		name:     label,
		requests: c.requests.WithLabelValues(label),
		latency:  c.latency.WithLabelValues(label),
		streams:  c.streams.WithLabelValues(label),
		errVec:   c.errors,
	}
}

// For returns the instruments of fullMethod, or the shared "other" ones for a
// method that was not known at start-up. The map is never written after New,
// so concurrent reads need no lock.
func (c *Collector) For(fullMethod string) *Method {
	if m, ok := c.methods[fullMethod]; ok {
		return m
	}
	return c.other
}

// SetRuntimeUp records the outcome of a readiness probe.
func (c *Collector) SetRuntimeUp(up bool) {
	if up {
		c.backendUp.Set(1)
	} else {
		c.backendUp.Set(0)
	}
}

// Done records one finished call that started at start.
func (m *Method) Done(start time.Time, err error) {
	m.requests.Inc()
	m.latency.Observe(time.Since(start).Seconds())
	if err == nil {
		return
	}
	code := status.Code(err)
	if code == codes.OK {
		return
	}
	if int(code) >= len(m.errs) {
		m.errVec.WithLabelValues(m.name, code.String()).Inc()
		return
	}
	p := m.errs[code].Load()
	if p == nil {
		ctr := m.errVec.WithLabelValues(m.name, code.String())
		m.errs[code].CompareAndSwap(nil, &ctr)
		p = m.errs[code].Load()
	}
	(*p).Inc()
}

// StreamOpened and StreamClosed bracket a streaming call.
func (m *Method) StreamOpened() { m.streams.Inc() }

// StreamClosed is the counterpart of StreamOpened.
func (m *Method) StreamClosed() { m.streams.Dec() }
