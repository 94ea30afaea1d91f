// Package goroutinetest lets a test wait until another goroutine blocks in
// a given function (on a channel, a select, a lock, a network read): the
// point a test would otherwise guess with a sleep.
package goroutinetest

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// WaitBlocked waits, up to 10 s, until a goroutine that is not running or
// runnable has fn on its stack. fn is package-qualified as a stack trace
// names it, e.g. "server.(*servingListener).Accept".
func WaitBlocked(t testing.TB, fn string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !Blocked(fn) {
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine blocked in %s within 10 s", fn)
		}
		time.Sleep(time.Millisecond)
	}
}

// Blocked reports whether a goroutine that is not running or runnable has
// fn on its stack.
func Blocked(fn string) bool {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range strings.Split(string(buf), "\n\n") {
		head, frames, _ := strings.Cut(g, "\n")
		if strings.Contains(head, "[running]") || strings.Contains(head, "[runnable]") {
			continue
		}
		for _, l := range strings.Split(frames, "\n") {
			// A frame is "path/pkg.Func(args)": fn must begin the line or
			// follow the path's last slash.
			if strings.HasPrefix(l, fn+"(") || strings.Contains(l, "/"+fn+"(") {
				return true
			}
		}
	}
	return false
}
