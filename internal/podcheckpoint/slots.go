package podcheckpoint

import (
	"sync"
	"time"
)

// slots bounds the background work of one kind the reconciler runs at once
// (exports, source checks): max in all and perNS for the objects of one
// namespace, so that one namespace's objects neither start a goroutine
// each nor take every slot. Work that finds none is queued again after
// slotWait.
type slots struct {
	max, perNS int
	mu         sync.Mutex
	running    int
	byNS       map[string]int
}

// slotWait is how long an object that found no slot waits before it is
// looked at again.
var slotWait = 2 * time.Second

func newSlots(max, perNS int) *slots {
	return &slots{max: max, perNS: perNS, byNS: map[string]int{}}
}

// take takes a slot for an object of namespace ns, if one is free.
func (s *slots) take(ns string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running >= s.max || s.byNS[ns] >= s.perNS {
		return false
	}
	s.running++
	s.byNS[ns]++
	return true
}

// give returns a slot take gave.
func (s *slots) give(ns string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	if s.byNS[ns]--; s.byNS[ns] <= 0 {
		delete(s.byNS, ns)
	}
}

// Bounds of the reconciler's background work.
const (
	maxExports        = 4
	maxNSExports      = 2
	maxSourceChecks   = 8
	maxNSSourceChecks = 2
)
