package kubeapi

import (
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"

	"github.com/cri-shim/cri-shim/internal/backoff"
)

// kind is what a queued item writes.
type kind int

const (
	kindStatus kind = iota // pod conditions, coalesced per pod
	kindEvent              // one event, never coalesced
)

func (k kind) String() string {
	if k == kindStatus {
		return "status"
	}
	return "event"
}

// item is one pending write. Items with the same key coalesce: a pod's
// conditions merge (the newer of a type wins). The key is
// "<kind>/<namespace>/<id>" (itemKey): the queue's order reads the first
// two parts (fairOrder).
type item struct {
	key   string
	ns    string
	kind  kind
	pod   PodRef
	conds map[string]Condition // kindStatus: by condition type
	event *Event               // kindEvent
	tries int                  // failed attempts so far
}

// merge folds newer into it (same key).
func (it *item) merge(newer *item) {
	if it.kind == kindStatus {
		for t, c := range newer.conds {
			it.conds[t] = c
		}
		it.pod = newer.pod
	}
}

func itemKey(k kind, ns, id string) string {
	if k == kindStatus {
		return "pod/" + ns + "/" + id
	}
	return "event/" + ns + "/" + id
}

// queue holds the writes waiting for the API server. client-go's workqueue
// holds their keys (a key is queued once however often it is put, and one
// put while its write is in flight is queued again after it) in fairOrder
// and delays a failed key's retry; the payloads wait in pending, where the
// writes of one key coalesce. put never blocks: beyond max writes (pending
// and in hand), a write of a new key is dropped and counted, and so is an
// event beyond maxEvents of all namespaces or maxNSEvents of its own, so
// that one namespace's events leave room for others' and for pod status.
type queue struct {
	wq      workqueue.TypedRateLimitingInterface[string]
	max     int
	dropped func(kind) // called with mu held; must not block

	mu       sync.Mutex
	pending  map[string]*item
	held     int // items taken and not yet done
	statuses int // status items pending or in hand
	// events counts the event items pending or in hand, of all
	// namespaces and by namespace.
	events   int
	nsEvents map[string]int
}

// The share of the queue events may take: three quarters of it in all, a
// sixteenth for one namespace's.
func (q *queue) maxEvents() int   { return max(1, q.max*3/4) }
func (q *queue) maxNSEvents() int { return max(1, q.max/16) }

func newQueue(max int, minDelay, maxDelay time.Duration, dropped func(kind)) *queue {
	const name = "kubeapi_writes"
	keys := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: name, Queue: &fairOrder{}})
	delaying := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Name: name, Queue: keys})
	return &queue{
		wq: workqueue.NewTypedRateLimitingQueueWithConfig(backoff.RetryLimiter(minDelay, maxDelay),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name, DelayingQueue: delaying}),
		max:      max,
		dropped:  dropped,
		pending:  map[string]*item{},
		nsEvents: map[string]int{},
	}
}

// put queues it, merging it into a pending item of the same key.
func (q *queue) put(it *item) {
	q.mu.Lock()
	if p, ok := q.pending[it.key]; ok {
		p.merge(it)
		q.mu.Unlock()
		return
	}
	if len(q.pending)+q.held >= q.max ||
		it.kind == kindEvent && (q.events >= q.maxEvents() || q.nsEvents[it.ns] >= q.maxNSEvents()) {
		q.dropped(it.kind)
		q.mu.Unlock()
		return
	}
	q.pending[it.key] = it
	q.count(it, 1)
	q.mu.Unlock()
	q.wq.Add(it.key)
}

// count adds n to the counts of it's kind. q.mu held.
func (q *queue) count(it *item, n int) {
	if it.kind == kindStatus {
		q.statuses += n
		return
	}
	q.events += n
	if c := q.nsEvents[it.ns] + n; c > 0 {
		q.nsEvents[it.ns] = c
	} else {
		delete(q.nsEvents, it.ns)
	}
}

// take waits for the next key and returns its item (nil when its write was
// already made under a retry of the key); ok is false once the queue is shut
// down and empty. Every taken key is handed back with done or retry.
func (q *queue) take() (key string, it *item, ok bool) {
	key, shutdown := q.wq.Get()
	if shutdown {
		return "", nil, false
	}
	q.mu.Lock()
	it = q.pending[key]
	delete(q.pending, key)
	if it != nil {
		q.held++
	}
	q.mu.Unlock()
	if it == nil {
		q.wq.Done(key)
	}
	return key, it, true
}

// done ends the write of a taken item: made, or given up.
func (q *queue) done(it *item) {
	q.mu.Lock()
	q.held--
	q.count(it, -1)
	q.mu.Unlock()
	q.wq.Forget(it.key)
	q.wq.Done(it.key)
}

// retry hands a taken item whose write failed back for a later attempt
// after its key's backoff; if a newer item of its key was queued meanwhile,
// the two merge (the newer values win) and are written at once.
func (q *queue) retry(it *item) {
	q.mu.Lock()
	q.held--
	if newer, ok := q.pending[it.key]; ok {
		it.merge(newer)
		q.count(it, -1) // two counted items became one
	}
	q.pending[it.key] = it
	q.mu.Unlock()
	q.wq.AddRateLimited(it.key)
	q.wq.Done(it.key)
}

// statusPending says whether a pod status write is waiting or in hand.
func (q *queue) statusPending() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.statuses > 0
}

// len is the number of writes waiting or in hand.
func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending) + q.held
}

// shutDown makes take return false once the queue is empty.
func (q *queue) shutDown() { q.wq.ShutDown() }

// fairOrder is the order in which the workqueue gives out the writes'
// keys: pod status writes first, then events; within each, the namespaces
// take turns (roundRobin), so a namespace's readiness-gate write waits for
// at most one of each other namespace's status writes, however many those
// have queued. The workqueue calls it under its own lock.
type fairOrder struct {
	classes [2]roundRobin[string] // kindStatus, kindEvent
}

func keyShare(key string) (kind, string) {
	k, rest, _ := strings.Cut(key, "/")
	ns, _, _ := strings.Cut(rest, "/")
	if k == "pod" {
		return kindStatus, ns
	}
	return kindEvent, ns
}

func (o *fairOrder) Touch(string) {}

func (o *fairOrder) Push(key string) {
	k, ns := keyShare(key)
	o.classes[k].push(ns, key)
}

func (o *fairOrder) Len() int { return o.classes[0].len() + o.classes[1].len() }

func (o *fairOrder) Pop() string {
	for i := range o.classes {
		if key, ok := o.classes[i].pop(); ok {
			return key
		}
	}
	return ""
}
