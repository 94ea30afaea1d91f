package criucheck

import (
	criucore "github.com/checkpoint-restore/go-criu/v8/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/seccomp"
)

// checkSeccompMode: a container whose spec has a seccomp profile runs every
// thread filtered (or in strict mode, which allows less); CRIU restores a
// thread's mode and filter chain as the image says (criu/seccomp.c), so a
// thread without one would run unconfined.
func (c *checker) checkSeccompMode(image string, mode criucore.SeccompMode, filter uint32) error {
	switch mode {
	case criucore.SeccompMode_disabled:
		if c.p.seccomp != nil {
			return refuse(image, "thread_core.seccomp_mode", "disabled, and the container's spec has a seccomp profile")
		}
	case criucore.SeccompMode_strict:
	case criucore.SeccompMode_filter:
		c.seccompUsed[filter] = true
	default:
		return refuse(image, "thread_core.seccomp_mode", "unknown mode %d", mode)
	}
	return nil
}

// checkSeccomp reads the filter chains the threads use and compares each
// with the spec's profile (seccomp_bpf.go).
func (c *checker) checkSeccomp() error {
	const name = "seccomp.img"
	if len(c.seccompUsed) == 0 {
		return nil
	}
	if !c.has("seccomp", name) {
		return refuse(name, "", "missing, and threads are filtered")
	}
	var e seccomp.SeccompEntry
	if err := oneEntry(c.dir, name, "SECCOMP", &e); err != nil {
		return asRefusal(name, err)
	}
	fs := e.GetSeccompFilters()
	for start := range c.seccompUsed {
		// A thread's filter is an index into the list, its chain the
		// filters reached through prev (criu/seccomp.c,
		// seccomp_dump_thread and prepare_seccomp_filters; 0 ends it).
		var chain []*seccompFilter
		seen := map[uint32]bool{}
		for i := start; ; {
			if i >= uint32(len(fs)) {
				return refuse(name, "seccomp_filters", "a thread's chain reaches filter %d of %d", i, len(fs))
			}
			if seen[i] {
				return refuse(name, "seccomp_filters", "the chain through filter %d loops", i)
			}
			seen[i] = true
			chain = append(chain, &seccompFilter{index: int(i), code: fs[i].GetFilter(), flags: fs[i].GetFlags()})
			if fs[i].Prev == nil {
				break
			}
			i = fs[i].GetPrev()
		}
		if c.p.seccomp != nil {
			if err := checkChain(name, chain, c.p.seccomp); err != nil {
				return err
			}
		}
	}
	return nil
}
