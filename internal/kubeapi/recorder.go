package kubeapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cri-shim/cri-shim/internal/backoff"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record/util"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// The recorder writes events as client-go's k8s.io/client-go/tools/events
// recorder does (that package imports the full clientset, which the shim
// does not link: see Resources), with its constants and its series rules.
const (
	// recordTries bounds the attempts at one write that fails in transport.
	recordTries = 12
	// recordRetry is the pause between them (jittered by up to a quarter).
	recordRetry = 10 * time.Second
	// seriesFinish: a series not seen for this long is written a last time
	// and forgotten, as is an event seen once.
	seriesFinish = 6 * time.Minute
	// seriesRefresh: open series are written again this often, so that the
	// API server's TTL does not remove them.
	seriesRefresh = 30 * time.Minute
	// recordQueue bounds the events waiting for the recorder's writer
	// (client-go's maxQueuedEvents), recordNSQueue those of one namespace;
	// beyond them they are dropped and counted.
	recordQueue   = 1000
	recordNSQueue = recordQueue / 8
	// spamBurst and spamQPS are client-go's spam filter of one object's
	// events (tools/record, events_cache.go: defaultSpamBurst,
	// defaultSpamQPS): 25 at once, then one every 5 minutes.
	spamBurst = 25
	spamQPS   = 1. / 300.
	// spamObjects bounds the objects the spam filter remembers (client-go's
	// maxLruCacheEntries).
	spamObjects = 4096
)

// seriesKey is what makes two events one series (tools/events, getKey):
// the note is not part of it, so a series shows its first note.
type seriesKey struct {
	eventType, action, reason string
	regarding                 corev1.ObjectReference
}

// recorder aggregates the shim's events into events.k8s.io/v1 Events with
// series, filters each object's events as client-go's recorder does, and
// writes them from one goroutine, in order, as client-go's event sink does.
type recorder struct {
	res      Resources
	instance string // reportingInstance
	log      *slog.Logger
	retry    time.Duration
	now      func() time.Time
	spam     *spamFilter
	// dropped counts an event not written, by why (spam, queue_full).
	dropped func(reason string)

	mu    sync.Mutex
	cache map[seriesKey]*eventsv1.Event
	// wg counts the events queued or being written.
	wg sync.WaitGroup

	// queue holds the events to write, the namespaces taking turns
	// (roundRobin: one namespace's burst of events does not hold up
	// another's for longer than one event each); the writer starts with
	// the first (writeQueued), is woken by wake, and, once its context
	// ends, takes no more (closed).
	qmu    sync.Mutex
	queue  roundRobin[*eventsv1.Event]
	wake   chan struct{}
	closed bool
	// statusPending says whether a pod status write waits in the writer:
	// an event write yields to it (nil: never).
	statusPending func() bool
	start         sync.Once
}

func newRecorder(res Resources, log *slog.Logger, dropped func(reason string)) *recorder {
	host, _ := os.Hostname()
	return &recorder{res: res, instance: ReportingController + "-" + host, log: log, retry: recordRetry,
		now: time.Now, cache: map[seriesKey]*eventsv1.Event{}, dropped: dropped, wake: make(chan struct{}, 1),
		spam: &spamFilter{cache: lru.New(spamObjects), clock: clock.RealClock{}}}
}

// spamFilter is client-go's EventSourceObjectSpamFilter (tools/record,
// events_cache.go): one token bucket per object and event type (spamBurst,
// refilled at spamQPS), the buckets of the last spamObjects objects kept.
// It is rebuilt from the same parts (flowcontrol's passive bucket,
// k8s.io/utils/lru) because tools/record links strategicpatch and
// kube-openapi: 4 MB of binary a node agent does not need.
type spamFilter struct {
	mu    sync.Mutex
	cache *lru.Cache
	clock clock.PassiveClock
}

// allow takes a token of e's bucket; false when it has none left.
func (f *spamFilter) allow(e *Event) bool {
	o := e.Regarding
	// client-go's getSpamKey: the source (always cri-shim here), the
	// object and the type, not the reason.
	key := strings.Join([]string{ReportingController, o.Kind, o.Namespace, o.Name, string(o.UID), o.APIVersion, e.Type}, "/")
	f.mu.Lock()
	defer f.mu.Unlock()
	var rl flowcontrol.PassiveRateLimiter
	if v, ok := f.cache.Get(key); ok {
		rl = v.(flowcontrol.PassiveRateLimiter)
	} else {
		rl = flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(spamQPS, spamBurst, f.clock)
		f.cache.Add(key, rl)
	}
	return rl.TryAccept()
}

// run finishes and refreshes series until ctx ends, then waits for the
// writes in flight (which end with ctx).
func (r *recorder) run(ctx context.Context) {
	finish, refresh := time.NewTicker(seriesFinish), time.NewTicker(seriesRefresh)
	defer finish.Stop()
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			r.wg.Wait()
			return
		case <-finish.C:
			r.finishSeries(ctx)
		case <-refresh.C:
			r.refreshSeries(ctx)
		}
	}
}

// record starts writing e: a new Event, or the next count of its series.
// It does not wait for the API server.
func (r *recorder) record(ctx context.Context, e *Event) {
	if e.Type != corev1.EventTypeNormal && e.Type != corev1.EventTypeWarning {
		r.log.Error("event of an unsupported type not written", "type", e.Type, "reason", e.Reason)
		return
	}
	now := r.now()
	ns := e.Regarding.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: util.GenerateEventName(e.Regarding.Name, now.UnixNano()), Namespace: ns},
		EventTime:           metav1.MicroTime{Time: now},
		ReportingController: ReportingController,
		ReportingInstance:   r.instance,
		Action:              e.Action,
		Reason:              e.Reason,
		Regarding:           e.Regarding,
		Note:                e.Note,
		Type:                e.Type,
	}
	if !r.spam.allow(e) {
		r.dropped("spam")
		r.log.Debug("event of an object over its rate not written", "reason", e.Reason, "regarding", e.Regarding.Name)
		return
	}
	if ev = r.aggregate(ev, now); ev == nil {
		return
	}
	r.start.Do(func() { go r.writeQueued(ctx) })
	r.qmu.Lock()
	defer r.qmu.Unlock()
	if r.closed {
		return
	}
	if r.queue.len() >= recordQueue || r.queue.lenOf(ev.Namespace) >= recordNSQueue {
		r.dropped("queue_full")
		r.log.Warn("event not written: the recorder's queue is full", "reason", e.Reason, "regarding", e.Regarding.Name)
		return
	}
	r.wg.Add(1)
	r.queue.push(ev.Namespace, ev)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// queued is the number of events waiting.
func (r *recorder) queued() int {
	r.qmu.Lock()
	defer r.qmu.Unlock()
	return r.queue.len()
}

// writeQueued writes the queued events, the namespaces taking turns, until
// ctx ends, then drops what is left.
func (r *recorder) writeQueued(ctx context.Context) {
	for {
		r.qmu.Lock()
		ev, ok := r.queue.pop()
		if !ok && ctx.Err() == nil {
			r.qmu.Unlock()
			select {
			case <-r.wake:
			case <-ctx.Done():
			}
			continue
		}
		if ctx.Err() != nil {
			r.closed = true
			n := r.queue.len()
			if ok {
				n++
			}
			r.queue = roundRobin[*eventsv1.Event]{}
			r.qmu.Unlock()
			for range n {
				r.wg.Done()
			}
			return
		}
		r.qmu.Unlock()
		r.yield(ctx)
		r.write(ctx, ev)
		r.wg.Done()
	}
}

// yieldMax bounds how long an event write waits for the status writes
// queued beside it. Both share the process's token bucket; in a restart
// storm (every pod of a node at once) a node has two events per status
// write, and the readiness gate is what the workload's Service waits on.
const yieldMax = 10 * time.Second

// yield waits, at most yieldMax, while a pod status write is pending.
func (r *recorder) yield(ctx context.Context) {
	if r.statusPending == nil {
		return
	}
	deadline := r.now().Add(yieldMax)
	for r.statusPending() && r.now().Before(deadline) {
		if !backoff.Sleep(ctx, 20*time.Millisecond) {
			return
		}
	}
}

// aggregate puts ev in the cache and returns what to write: ev itself when
// new, the cached Event with its series count raised when not, or nil when
// the series is already being counted (its next refresh or finish writes it).
func (r *recorder) aggregate(ev *eventsv1.Event, now time.Time) *eventsv1.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := seriesKey{eventType: ev.Type, action: ev.Action, reason: ev.Reason, regarding: ev.Regarding}
	cached, ok := r.cache[key]
	if !ok {
		r.cache[key] = ev
		return ev.DeepCopy()
	}
	if cached.Series != nil {
		cached.Series.Count++
		cached.Series.LastObservedTime = metav1.MicroTime{Time: now}
		return nil
	}
	cached.Series = &eventsv1.EventSeries{Count: 2, LastObservedTime: metav1.MicroTime{Time: now}}
	return cached.DeepCopy()
}

// write writes ev, retrying what failed in transport.
func (r *recorder) write(ctx context.Context, ev *eventsv1.Event) {
	for try := 1; ; try++ {
		if _, retry := r.writeOnce(ctx, ev); !retry {
			return
		}
		if try >= recordTries {
			r.log.Error("event not written (retry limit reached)", "reason", ev.Reason, "regarding", ev.Regarding.Name)
			return
		}
		if !backoff.Sleep(ctx, r.retry+rand.N(r.retry/4+1)) {
			return
		}
	}
}

// writeOnce patches the series of ev, or creates ev when it has none or
// its Event is gone (expired); it reports whether a failure may pass.
func (r *recorder) writeOnce(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, bool) {
	var out *eventsv1.Event
	var err error
	series := ev.Series != nil
	// The event's namespace waits its turn in the node's token bucket.
	ctx = ForNamespace(ctx, ev.Namespace)
	if series {
		patch, perr := json.Marshal(map[string]any{"series": ev.Series})
		if perr != nil {
			r.log.Error("event series not written", "err", perr)
			return nil, false
		}
		out, err = r.res.PatchEvent(ctx, ev.Namespace, ev.Name, patch)
	}
	if !series || util.IsKeyNotFoundError(err) {
		ev.ResourceVersion = ""
		out, err = r.res.CreateEvent(ctx, ev)
	}
	if err == nil {
		return out, false
	}
	var construct *rest.RequestConstructionError
	var status *apierrors.StatusError
	switch {
	case errors.As(err, &construct):
		r.log.Error("event not written (will not retry)", "reason", ev.Reason, "err", err)
		return nil, false
	case errors.As(err, &status):
		// A create racing the first write of the same series: its
		// patch will find the Event.
		if apierrors.IsAlreadyExists(err) && series {
			return nil, true
		}
		r.log.Warn("event refused by the API server (will not retry)", "reason", ev.Reason, "err", err)
		return nil, false
	}
	r.log.Warn("event not written (will retry)", "reason", ev.Reason, "err", err)
	return nil, true
}

// finishSeries writes the last count of the series not seen for
// seriesFinish, and forgets them and the single events as old. The writes
// are made without the cache's lock, so recording goes on meanwhile.
func (r *recorder) finishSeries(ctx context.Context) {
	cut := r.now().Add(-seriesFinish)
	done := r.sweep(func(ev *eventsv1.Event) (write, forget bool) {
		switch {
		case ev.Series != nil && ev.Series.LastObservedTime.Time.Before(cut):
			return true, false
		case ev.Series == nil && ev.EventTime.Time.Before(cut):
			return false, true
		}
		return false, false
	})
	for _, d := range done {
		if _, retry := r.writeOnce(ctx, d.copy); !retry {
			r.settle(d, nil, true)
		}
	}
}

// refreshSeries writes every open series again.
func (r *recorder) refreshSeries(ctx context.Context) {
	done := r.sweep(func(ev *eventsv1.Event) (bool, bool) { return ev.Series != nil, false })
	for _, d := range done {
		if out, retry := r.writeOnce(ctx, d.copy); !retry && out != nil {
			r.settle(d, out, false)
		}
	}
}

// swept is a cached Event a sweep writes: its key, the Event as cached
// then, and a copy to write.
type swept struct {
	key       seriesKey
	was, copy *eventsv1.Event
	count     int32
}

// sweep forgets the cached Events pick says to forget and returns copies of
// those it says to write.
func (r *recorder) sweep(pick func(*eventsv1.Event) (write, forget bool)) []swept {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []swept
	for k, ev := range r.cache {
		write, forget := pick(ev)
		switch {
		case forget:
			delete(r.cache, k)
		case write:
			out = append(out, swept{key: k, was: ev, copy: ev.DeepCopy(), count: ev.Series.Count})
		}
	}
	return out
}

// settle records a sweep's write of d: the cached Event becomes out (or
// is forgotten), unless the series was counted again meanwhile, which its
// next sweep writes.
func (r *recorder) settle(d swept, out *eventsv1.Event, forget bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.cache[d.key]; cur != d.was || cur.Series == nil || cur.Series.Count != d.count {
		return
	}
	if forget {
		delete(r.cache, d.key)
		return
	}
	r.cache[d.key] = out
}
