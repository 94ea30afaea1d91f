package kubeapi

import (
	"container/list"
	"sync"
)

// kind is what a queued item writes.
type kind int

const (
	kindStatus kind = iota // pod conditions, coalesced per pod
	kindEvent              // one event, never coalesced
	kindOp                 // a caller's write, the latest per key
)

func (k kind) String() string {
	switch k {
	case kindStatus:
		return "status"
	case kindEvent:
		return "event"
	}
	return "op"
}

// item is one pending write. Items with the same key coalesce: a pod's
// conditions merge (the newer of a type wins), an op is replaced by the newer.
type item struct {
	key   string
	kind  kind
	pod   PodRef
	conds map[string]Condition // kindStatus: by condition type
	event *Event               // kindEvent
	op    Op                   // kindOp
	tries int                  // failed attempts so far
}

// merge folds newer into it (same key).
func (it *item) merge(newer *item) {
	switch it.kind {
	case kindStatus:
		for t, c := range newer.conds {
			it.conds[t] = c
		}
		it.pod = newer.pod
	case kindOp:
		it.op = newer.op
	}
}

// queue is a bounded FIFO of items, coalescing by key. put never blocks:
// when full, the oldest item is dropped and counted.
type queue struct {
	mu      sync.Mutex
	max     int
	l       *list.List // of *item, oldest first
	byKey   map[string]*list.Element
	wake    chan struct{} // one pending wake-up for the writer
	dropped func(kind)    // called with the lock held; must not block
}

func newQueue(max int, dropped func(kind)) *queue {
	return &queue{max: max, l: list.New(), byKey: map[string]*list.Element{}, wake: make(chan struct{}, 1), dropped: dropped}
}

// put queues it, merging it into a pending item of the same key.
func (q *queue) put(it *item) {
	q.mu.Lock()
	if e, ok := q.byKey[it.key]; ok {
		e.Value.(*item).merge(it)
	} else {
		q.byKey[it.key] = q.l.PushBack(it)
		q.trim()
	}
	q.mu.Unlock()
	q.signal()
}

// putBack returns an item whose write failed to the front of the queue; if
// a newer item of its key was queued meanwhile, the newer one absorbs it
// (its values win) and keeps its place.
func (q *queue) putBack(it *item) {
	q.mu.Lock()
	if e, ok := q.byKey[it.key]; ok {
		newer := e.Value.(*item)
		it.merge(newer)
		newer.conds, newer.op, newer.pod = it.conds, it.op, it.pod
		if it.tries > newer.tries {
			newer.tries = it.tries
		}
	} else {
		q.byKey[it.key] = q.l.PushFront(it)
		q.trim()
	}
	q.mu.Unlock()
	q.signal()
}

// trim drops the oldest items beyond max. Called with the lock held.
func (q *queue) trim() {
	for q.l.Len() > q.max {
		it := q.l.Remove(q.l.Front()).(*item)
		delete(q.byKey, it.key)
		q.dropped(it.kind)
	}
}

// take removes and returns the oldest item, or nil.
func (q *queue) take() *item {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.l.Front()
	if e == nil {
		return nil
	}
	it := q.l.Remove(e).(*item)
	delete(q.byKey, it.key)
	return it
}

// len is the number of pending items.
func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.l.Len()
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}
