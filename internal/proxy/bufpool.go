package proxy

import "google.golang.org/grpc/mem"

// answerPool holds the contiguous copies of large runtime answers that a
// bytes hook reads (bytesCall.next): a node's relist is one every second,
// close to a megabyte at a thousand containers. Unlike gRPC's default pool
// (mem.DefaultBufferPool, grpc-go mem/buffer_pool.go), it does not zero a
// buffer it hands out, since the copy overwrites all of it, and it keeps at
// most keptAnswers buffers, so the memory it holds between relists is
// bounded whatever the concurrency was.
type answerPool struct{ free chan *[]byte }

// keptAnswers is how many buffers answerPool keeps: the kubelet's relists
// come one at a time.
const keptAnswers = 2

var answers mem.BufferPool = answerPool{free: make(chan *[]byte, keptAnswers)}

// Get returns a buffer of length n, not zeroed.
func (p answerPool) Get(n int) *[]byte {
	select {
	case b := <-p.free:
		if cap(*b) >= n {
			*b = (*b)[:n]
			return b
		}
	default:
	}
	b := make([]byte, n)
	return &b
}

// Put keeps b for a later Get, unless the pool is full.
func (p answerPool) Put(b *[]byte) {
	select {
	case p.free <- b:
	default:
	}
}
