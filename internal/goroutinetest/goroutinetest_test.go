package goroutinetest

import "testing"

//go:noinline
func waitOn(c chan struct{}) { <-c }

// A goroutine parked on a channel is found by its function; one that is not
// there is not.
func TestBlocked(t *testing.T) {
	c := make(chan struct{})
	done := make(chan struct{})
	go func() { waitOn(c); close(done) }()
	WaitBlocked(t, "goroutinetest.waitOn")
	if Blocked("goroutinetest.noSuchFunction") {
		t.Fatal("a function no goroutine runs reported blocked")
	}
	close(c)
	<-done
	if Blocked("goroutinetest.waitOn") {
		t.Fatal("a goroutine that went on is still reported blocked")
	}
}
