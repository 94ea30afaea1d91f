package criucheck

import (
	"os"
	"strconv"
	"strings"

	criucore "github.com/checkpoint-restore/go-criu/v8/crit/images/criu-core"
	"golang.org/x/sys/unix"
)

// Scheduling policies (include/uapi/linux/sched.h).
const (
	schedFIFO        = 1
	schedRR          = 2
	schedDeadline    = 6
	schedResetOnFork = 0x40000000
	loginUIDUnset    = ^uint32(0)
)

// rlimitNames are the spec's names of RLIMIT_* by number.
var rlimitNames = []string{"RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_RSS",
	"RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_AS", "RLIMIT_LOCKS", "RLIMIT_SIGPENDING",
	"RLIMIT_MSGQUEUE", "RLIMIT_NICE", "RLIMIT_RTPRIO", "RLIMIT_RTTIME"}

// checkTask checks what a task (not a thread) holds and CRIU sets as root
// (criu/cr-restore.c, prepare_oom_score_adj, restore loginuid,
// prepare_rlimits): its OOM score, login UID and resource limits.
func (c *checker) checkTask(name string, tc *criucore.TaskCoreEntry) error {
	if tc.OomScoreAdj != nil && c.p.oomScoreAdj != nil && tc.GetOomScoreAdj() < int32(*c.p.oomScoreAdj) && !c.p.may("CAP_SYS_RESOURCE") {
		return refuse(name, "tc.oom_score_adj", "%d is below the container's %d; lowering it needs CAP_SYS_RESOURCE", tc.GetOomScoreAdj(), *c.p.oomScoreAdj)
	}
	if tc.Loginuid != nil && tc.GetLoginuid() != loginUIDUnset && tc.GetLoginuid() != ownLoginUID() {
		return refuse(name, "tc.loginuid", "%d; the restored task's login UID is the runtime's or unset", tc.GetLoginuid())
	}
	rl := tc.GetRlimits().GetRlimits()
	if len(rl) > len(rlimitNames) {
		return refuse(name, "tc.rlimits", "%d limits, the kernel has %d", len(rl), len(rlimitNames))
	}
	for i, r := range rl {
		ceiling, ok := c.specHardLimit(rlimitNames[i])
		if !ok && c.opts.HardLimits != nil {
			ceiling, ok = c.opts.HardLimits(i)
		}
		if ok && r.GetMax() > ceiling {
			return refuse(name, "tc.rlimits."+rlimitNames[i], "hard limit %d is above the container's %d; raising it needs CAP_SYS_RESOURCE", r.GetMax(), ceiling)
		}
	}
	return nil
}

func (c *checker) specHardLimit(name string) (uint64, bool) {
	for _, r := range c.p.spec.Process.Rlimits {
		if r.Type == name {
			return r.Hard, true
		}
	}
	return 0, false
}

// OwnHardLimits are this process's hard limits, which a container runc
// starts from it inherits (the runtime shim's, checking its own restores).
func OwnHardLimits(resource int) (uint64, bool) {
	var r unix.Rlimit
	if err := unix.Getrlimit(resource, &r); err != nil {
		return 0, false
	}
	return r.Max, true
}

func ownLoginUID() uint32 {
	b, err := os.ReadFile("/proc/self/loginuid")
	if err != nil {
		return loginUIDUnset
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return loginUIDUnset
	}
	return uint32(v)
}

// checkSched refuses a real-time policy or a raised priority without
// CAP_SYS_NICE (criu/cr-restore.c, validate_sched_parm accepts them; the
// restorer applies them as root).
func (c *checker) checkSched(name string, th *criucore.ThreadCoreEntry) error {
	if c.p.may("CAP_SYS_NICE") || c.p.spec.Process.Scheduler != nil {
		return nil
	}
	switch pol := th.GetSchedPolicy() &^ schedResetOnFork; pol {
	case schedFIFO, schedRR, schedDeadline:
		return refuse(name, "thread_core.sched_policy", "real-time policy %d; it needs CAP_SYS_NICE", pol)
	}
	if th.GetSchedNice() < 0 {
		return refuse(name, "thread_core.sched_nice", "%d; a negative nice value needs CAP_SYS_NICE", th.GetSchedNice())
	}
	return nil
}
