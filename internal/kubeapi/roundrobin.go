package kubeapi

// roundRobin holds values by namespace and gives them out a namespace at a
// time, in turn, and in order within a namespace: however many values one
// namespace holds, another's next value waits for at most one of each
// other namespace's. The writer's queue (queue.go), the events recorder's
// (recorder.go) and the token bucket (fairlimit.go) order their writes
// with it. Not safe for concurrent use.
type roundRobin[T any] struct {
	byNS map[string][]T
	// ring is the namespaces holding values, in the order of their turns.
	ring []string
	n    int
}

// push adds v at the end of namespace ns's values.
func (r *roundRobin[T]) push(ns string, v T) {
	if r.byNS == nil {
		r.byNS = map[string][]T{}
	}
	q, ok := r.byNS[ns]
	if !ok {
		r.ring = append(r.ring, ns)
	}
	r.byNS[ns] = append(q, v)
	r.n++
}

// pop takes the first value of the namespace whose turn it is; that
// namespace's next turn comes after every other's.
func (r *roundRobin[T]) pop() (v T, ok bool) {
	if len(r.ring) == 0 {
		return v, false
	}
	ns := r.ring[0]
	r.ring[0] = ""
	r.ring = r.ring[1:]
	q := r.byNS[ns]
	v = q[0]
	var zero T
	q[0] = zero
	if q = q[1:]; len(q) > 0 {
		r.byNS[ns] = q
		r.ring = append(r.ring, ns)
	} else {
		delete(r.byNS, ns)
	}
	r.n--
	return v, true
}

// remove drops the first value of namespace ns that match says is the one.
func (r *roundRobin[T]) remove(ns string, match func(T) bool) bool {
	q := r.byNS[ns]
	for i, x := range q {
		if !match(x) {
			continue
		}
		r.n--
		if q = append(q[:i:i], q[i+1:]...); len(q) > 0 {
			r.byNS[ns] = q
			return true
		}
		delete(r.byNS, ns)
		for j, x := range r.ring {
			if x == ns {
				r.ring = append(r.ring[:j:j], r.ring[j+1:]...)
				break
			}
		}
		return true
	}
	return false
}

// len is the number of values held; lenOf those of namespace ns.
func (r *roundRobin[T]) len() int            { return r.n }
func (r *roundRobin[T]) lenOf(ns string) int { return len(r.byNS[ns]) }
