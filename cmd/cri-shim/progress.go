package main

// Progress of long operations: a line updated in place on a terminal, plain
// lines otherwise (logs, pipes).

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/term"
)

// progress reports a long operation: on a terminal an update rewrites its
// line in place ("\r"); otherwise, in a log or a pipe, each update is a line
// of its own, and fewer of them.
type progress struct {
	w        io.Writer
	tty      bool
	interval time.Duration
	mu       sync.Mutex
	open     bool // a terminal line awaits its newline
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, tty: isTerminal(w), interval: plainInterval}
	if p.tty {
		p.interval = ttyInterval
	}
	return p
}

// isTerminal tells whether w is a terminal (golang.org/x/term).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// line prints a line of its own, ending an update in place first.
func (p *progress) line(format string, a ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endLocked()
	fmt.Fprintf(p.w, format+"\n", a...)
}

func (p *progress) update(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\x1b[K", s) // erase what a longer update left
		p.open = true
		return
	}
	fmt.Fprintln(p.w, s)
}

func (p *progress) endLocked() {
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
}

// every prints status() every interval until the returned stop is called;
// stop returns once the last update is written and ends the line.
func (p *progress) every(status func() string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(p.interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				p.update(status())
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		p.mu.Lock()
		p.endLocked()
		p.mu.Unlock()
	}
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

func human(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}
