package kubeapi

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cri-shim/cri-shim/internal/backoff"
)

// ReportingController names the shim in the events it writes.
const ReportingController = "cri-shim"

// WriterOptions tune a Writer; zero values take the defaults.
type WriterOptions struct {
	// MaxQueue bounds the pending writes (default 4096); beyond it the
	// writes of new keys are dropped and counted. Events take at most
	// three quarters of it, one namespace's a sixteenth (queue.go).
	MaxQueue int
	// MinDelay and MaxDelay bound the backoff between failed attempts
	// (defaults 200ms and 30s).
	MinDelay, MaxDelay time.Duration
	// MaxTries drops an item after this many failed writes while the API
	// server answers probes (default 10); while it does not, items wait.
	MaxTries int
	Log      *slog.Logger
}

// Writer queues the shim's writes to the API server and writes them from
// one goroutine (Run) when the server answers. Its enqueueing methods never
// block and never fail; a nil *Writer (standalone, no API) drops everything.
type Writer struct {
	c   *Client
	res Resources // c's, once ready
	rec *recorder
	q   *queue
	log *slog.Logger
	o   WriterOptions
	up  atomic.Bool
	// mirrors maps static pods' UIDs to their mirror pods' (status.go);
	// used by Run's goroutine only.
	mirrors map[string]string

	dropped *prometheus.CounterVec
	writes  *prometheus.CounterVec
	upGauge prometheus.Gauge
	pending prometheus.GaugeFunc
	events  prometheus.GaugeFunc
	// recorder is rec for the events gauge, which other goroutines read.
	recorder atomic.Pointer[recorder]
}

// NewWriter makes a writer on c; call Run to start writing.
func NewWriter(c *Client, o WriterOptions) *Writer {
	if o.MaxQueue <= 0 {
		o.MaxQueue = 4096
	}
	if o.MinDelay <= 0 {
		o.MinDelay = 200 * time.Millisecond
	}
	if o.MaxDelay <= 0 {
		o.MaxDelay = 30 * time.Second
	}
	if o.MaxTries <= 0 {
		o.MaxTries = 10
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	w := &Writer{c: c, log: o.Log, o: o, mirrors: map[string]string{}}
	w.dropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cri_shim_kubeapi_dropped_total",
		Help: "Writes to the API server dropped before they were made, by kind (status, event) and why (queue_full, failed).",
	}, []string{"kind", "reason"})
	w.writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cri_shim_kubeapi_writes_total",
		Help: "Attempts to write to the API server, by kind and result (ok, retry, failed). Events count when handed to the events recorder.",
	}, []string{"kind", "result"})
	w.upGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cri_shim_kubeapi_up",
		Help: "1 while the API server answers the shim, 0 while its writes wait for it.",
	})
	w.q = newQueue(o.MaxQueue, o.MinDelay, o.MaxDelay, func(k kind) { w.dropped.WithLabelValues(k.String(), "queue_full").Inc() })
	w.pending = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cri_shim_kubeapi_queue_items",
		Help: "Writes waiting for the API server.",
	}, func() float64 { return float64(w.q.len()) })
	w.events = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cri_shim_kubeapi_event_queue_items",
		Help: "Events handed to the recorder and not yet written.",
	}, func() float64 {
		if r := w.recorder.Load(); r != nil {
			return float64(r.queued())
		}
		return 0
	})
	return w
}

// Collectors are the writer's metrics, for the shim's registry.
func (w *Writer) Collectors() []prometheus.Collector {
	return []prometheus.Collector{w.dropped, w.writes, w.upGauge, w.pending, w.events}
}

// Run writes queued items until ctx is done; until the client is ready
// they wait in the queue.
func (w *Writer) Run(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-w.c.Ready():
	}
	w.res = w.c.Resources()
	w.rec = newRecorder(w.res, w.log, func(reason string) { w.dropped.WithLabelValues(kindEvent.String(), reason).Inc() })
	w.rec.statusPending = w.q.statusPending
	w.recorder.Store(w.rec)
	recDone := make(chan struct{})
	go func() { w.rec.run(ctx); close(recDone) }()
	defer func() { <-recDone }()
	// Probes of a server that does not answer are jittered
	// (backoff.Retry), and so are a key's retries (the queue's rate
	// limiter), so that the nodes of a cluster do not retry in step after
	// an API server restart.
	retry := backoff.Retry(w.o.MinDelay, w.o.MaxDelay)
	// At stop the writes already queued are still made, while the API
	// server answers and for at most drainTimeout: the features that queue
	// them stop before the writer (server.Run's run group), so a readiness
	// gate or a PodCheckpoint's outcome queued just before is not lost.
	// Events handed over then are not written.
	writes, endWrites := context.WithCancel(context.WithoutCancel(ctx))
	defer endWrites()
	stop := context.AfterFunc(ctx, func() {
		w.q.shutDown()
		time.AfterFunc(drainTimeout, endWrites)
	})
	defer stop()
	for {
		_, it, ok := w.q.take()
		if !ok || writes.Err() != nil {
			return
		}
		if it == nil {
			continue
		}
		// While the API server does not answer, the one write in hand
		// waits for it; the others wait in the queue.
		for !w.up.Load() {
			pctx, cancel := context.WithTimeout(ctx, requestTimeout)
			err := w.c.Probe(pctx)
			cancel()
			if err == nil {
				w.setUp(true)
				break
			}
			if ctx.Err() != nil {
				return
			}
			w.log.Debug("API server not answering; writes wait", "err", err, "pending", w.q.len())
			backoff.Sleep(ctx, retry.Step())
		}
		wctx, cancel := context.WithTimeout(writes, requestTimeout)
		err := w.write(wctx, ctx, it)
		cancel()
		switch {
		case err == nil:
			w.writes.WithLabelValues(it.kind.String(), "ok").Inc()
			retry = backoff.Retry(w.o.MinDelay, w.o.MaxDelay)
			w.q.done(it)
		case writes.Err() != nil:
			return
		case Retryable(err) && it.tries+1 < w.o.MaxTries && ctx.Err() == nil:
			it.tries++
			w.writes.WithLabelValues(it.kind.String(), "retry").Inc()
			w.log.Info("API write failed; retrying", "key", it.key, "try", it.tries, "err", err)
			w.setUp(false)
			w.q.retry(it)
		default:
			w.writes.WithLabelValues(it.kind.String(), "failed").Inc()
			w.dropped.WithLabelValues(it.kind.String(), "failed").Inc()
			w.log.Warn("API write failed; dropped", "key", it.key, "tries", it.tries+1, "err", err)
			w.q.done(it)
		}
	}
}

func (w *Writer) setUp(up bool) {
	if w.up.Swap(up) != up {
		if up {
			w.upGauge.Set(1)
			w.log.Info("API server answers; writing queued status and events", "pending", w.q.len())
		} else {
			w.upGauge.Set(0)
			w.log.Warn("API server not answering; status and events are queued", "pending", w.q.len())
		}
	}
}

// write makes one write under ctx; an event is handed to the recorder,
// which writes it in the background under bg (Run's context).
func (w *Writer) write(ctx, bg context.Context, it *item) error {
	switch it.kind {
	case kindStatus:
		return w.patchConditions(forPodStatus(ctx, it.pod.Namespace), it.pod, it.conds)
	}
	w.rec.record(bg, it.event)
	return nil
}

// Retryable reports whether a failed write may succeed later unchanged: the
// server was unreachable, overloaded or failing, not refusing the request.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		return true // transport: connection refused, reset, timeout
	}
	return apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || se.Status().Code >= 500
}
