package criucheck

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	criucore "github.com/checkpoint-restore/go-criu/v8/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pstree"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// maxThreads bounds the threads of a restored tree (every thread has a core
// image to decode).
const maxThreads = 1 << 14

// nsIDs are a task's namespaces, by CRIU's namespace IDs.
type nsIDs [8]uint32

var nsNames = [8]string{"pid", "net", "ipc", "uts", "mnt", "user", "cgroup", "time"}

func idsOf(k *criucore.TaskKobjIdsEntry) nsIDs {
	return nsIDs{k.GetPidNsId(), k.GetNetNsId(), k.GetIpcNsId(), k.GetUtsNsId(),
		k.GetMntNsId(), k.GetUserNsId(), k.GetCgroupNsId(), k.GetTimeNsId()}
}

// checkInventory reads the root task's namespaces and refuses what would
// make CRIU run code of the image's choosing (plugins).
func (c *checker) checkInventory() error {
	const name = "inventory.img"
	var inv inventory.InventoryEntry
	if err := oneEntry(c.dir, name, "INVENTORY", &inv); err != nil {
		return refuse(name, "", "%v", err)
	}
	if pl := inv.GetPluginsEntry().GetPlugins(); len(pl) > 0 {
		return refuse(name, "plugins_entry", "names CRIU plugins %q; a pod checkpoint restores without plugins", pl)
	}
	if inv.RootIds == nil {
		return refuse(name, "root_ids", "missing: the image predates the CRIU versions runc's restore supports")
	}
	c.criuIDs = idsOf(inv.RootIds)
	return nil
}

// checkTree checks every thread of the process tree: its credentials,
// seccomp state and namespaces, and the task's OOM score.
func (c *checker) checkTree() error {
	const name = "pstree.img"
	var procs []*pstree.PstreeEntry
	threads := 0
	err := eachEntry(c.dir, name, "PSTREE", func() *pstree.PstreeEntry { return new(pstree.PstreeEntry) }, func(e *pstree.PstreeEntry) error {
		threads += max(1, len(e.Threads))
		if threads > maxThreads {
			return refuse(name, "threads", "more than %d threads", maxThreads)
		}
		procs = append(procs, e)
		return nil
	})
	if err != nil {
		return asRefusal(name, err)
	}
	if len(procs) == 0 {
		return refuse(name, "", "no process")
	}
	c.seccompUsed = map[uint32]bool{}
	c.pids = map[uint32]bool{}
	for _, pe := range procs {
		if c.pids[pe.GetPid()] {
			return refuse(name, "pid", "%d is there twice", pe.GetPid())
		}
		c.pids[pe.GetPid()] = true
	}
	for _, pe := range procs {
		// Sessions and process groups of the tree only: one outside it
		// is a process of the host (criu/pstree.c needs --shell-job).
		if !c.pids[pe.GetPgid()] || !c.pids[pe.GetSid()] {
			return refuse(name, "pgid", "process %d is in group %d, session %d: not processes of the checkpoint", pe.GetPid(), pe.GetPgid(), pe.GetSid())
		}
	}
	for i, pe := range procs {
		pid := pe.GetPid()
		core, err := c.readCore(pid, "process")
		if err != nil {
			return err
		}
		if core.GetTc().GetTaskState() == taskDead {
			if i == 0 {
				return refuse(pidImage("core", pid), "tc.task_state", "the root task is dead")
			}
			if err := c.checkZombie(pe, core); err != nil {
				return err
			}
			continue
		}
		tids := pe.GetThreads()
		if len(tids) == 0 {
			tids = []uint32{pid}
		}
		if tids[0] != pid {
			return refuse(name, "threads", "process %d: its first thread is %d, not the process (CRIU restores the task from core-%d.img)", pid, tids[0], pid)
		}
		// The leader's core is the task's, read above; every other
		// thread has its own.
		coreIDs, err := c.checkThread(pidImage("core", pid), core, true)
		if err != nil {
			return err
		}
		for _, tid := range tids[1:] {
			th, err := c.readCore(tid, "thread")
			if err != nil {
				return err
			}
			if _, err := c.checkThread(pidImage("core", tid), th, false); err != nil {
				return err
			}
		}
		ids, err := c.taskIDs(pid, coreIDs)
		if err != nil {
			return err
		}
		if i == 0 {
			c.root = ids
			if err := c.checkRootNamespaces(pidImage("core", pid)); err != nil {
				return err
			}
			continue
		}
		if err := c.checkNamespaces(pidImage("core", pid), ids); err != nil {
			return err
		}
	}
	return nil
}

// taskDead is CRIU's task_state of a zombie (COMPEL_TASK_DEAD,
// compel/include/uapi/task-state.h).
const taskDead = 2

// readCore reads the core image of process or thread id (what says which,
// for the refusal) and refuses one of another architecture. A task's own
// core is where CRIU's restore reads its state, whatever its thread list
// says (criu/cr-restore.c, fork_with_pid: open_core(vpid(item)), then
// item->pid->state).
func (c *checker) readCore(id uint32, what string) (*criucore.CoreEntry, error) {
	name := pidImage("core", id)
	var core criucore.CoreEntry
	if err := oneEntry(c.dir, name, "CORE", &core); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, refuse(name, "", "missing for %s %d of pstree.img", what, id)
		}
		return nil, asRefusal(name, err)
	}
	if core.GetMtype() != archOf() {
		return nil, refuse(name, "mtype", "%v, this node is %v", core.GetMtype(), archOf())
	}
	return &core, nil
}

// checkZombie checks a task that had exited and not been reaped when the
// checkpoint was taken. CRIU dumps it with a core of its name and exit code
// only (criu/cr-dump.c, dump_one_zombie) and a thread list it never fills
// in, so its thread ID is whatever was in memory; the restore forks it,
// sets its name and exits it with that code (criu/cr-restore.c,
// restore_one_zombie), reading neither credentials nor thread cores
// (check_core asks for them from live tasks only). It must still be the
// node's architecture and, where the image gives it namespaces of its own
// (ids-<pid>.img), stay in the container's.
func (c *checker) checkZombie(pe *pstree.PstreeEntry, core *criucore.CoreEntry) error {
	pid := pe.GetPid()
	name := pidImage("core", pid)
	if n := len(pe.GetThreads()); n > 1 {
		return refuse("pstree.img", "threads", "process %d is dead and lists %d threads; CRIU dumps a dead task with one", pid, n)
	}
	if !c.has("ids", pidImage("ids", pid)) {
		return nil
	}
	ids, err := c.taskIDs(pid, nil)
	if err != nil {
		return err
	}
	return c.checkNamespaces(name, ids)
}

// taskIDs are a task's namespaces: from ids-<pid>.img where the image has
// one (CRIU reads it first, criu/pstree.c), else from its core; both, where
// both are there, must agree.
func (c *checker) taskIDs(pid uint32, coreIDs *criucore.TaskKobjIdsEntry) (nsIDs, error) {
	name := pidImage("ids", pid)
	if !c.has("ids", name) {
		if coreIDs == nil {
			return nsIDs{}, refuse(pidImage("core", pid), "ids", "missing, and there is no %s", name)
		}
		return idsOf(coreIDs), nil
	}
	var k criucore.TaskKobjIdsEntry
	if err := oneEntry(c.dir, name, "IDS", &k); err != nil {
		return nsIDs{}, asRefusal(name, err)
	}
	ids := idsOf(&k)
	if coreIDs != nil && idsOf(coreIDs) != ids {
		return nsIDs{}, refuse(name, "", "names other namespaces than the task's core image")
	}
	return ids, nil
}

func (c *checker) has(kind, name string) bool {
	for _, n := range c.files[kind] {
		if n == name {
			return true
		}
	}
	return false
}

// archOf is this node's CRIU machine type.
func archOf() criucore.CoreEntryMarch {
	switch runtime.GOARCH {
	case "amd64":
		return criucore.CoreEntry_X86_64
	case "arm64":
		return criucore.CoreEntry_AARCH64
	case "ppc64le":
		return criucore.CoreEntry_PPC64
	case "s390x":
		return criucore.CoreEntry_S390
	case "riscv64":
		return criucore.CoreEntry_RISCV64
	}
	return criucore.CoreEntry_UNKNOWN
}

// checkThread checks one live thread's core (name is its image): its
// credentials, scheduling and seccomp state, and for the task's leader the
// task's own fields; it returns the leader's namespace IDs.
func (c *checker) checkThread(name string, core *criucore.CoreEntry, leader bool) (*criucore.TaskKobjIdsEntry, error) {
	th := core.GetThreadCore()
	if th == nil || th.Creds == nil {
		return nil, refuse(name, "thread_core.creds", "missing: the image predates the CRIU versions runc's restore supports")
	}
	if err := c.checkCreds(name, th.Creds); err != nil {
		return nil, err
	}
	if err := c.checkSched(name, th); err != nil {
		return nil, err
	}
	mode, filter := th.GetSeccompMode(), th.GetSeccompFilter()
	if th.SeccompMode == nil && core.GetTc() != nil && core.GetTc().OldSeccompMode != nil {
		mode, filter = core.GetTc().GetOldSeccompMode(), core.GetTc().GetOldSeccompFilter()
	}
	if err := c.checkSeccompMode(name, mode, filter); err != nil {
		return nil, err
	}
	if !leader {
		return nil, nil
	}
	tc := core.GetTc()
	if tc == nil {
		return nil, refuse(name, "tc", "missing for the task's leader")
	}
	if err := c.checkTask(name, tc); err != nil {
		return nil, err
	}
	return core.Ids, nil
}

// checkNamespaces refuses a task outside the root task's namespaces: CRIU
// would create the namespaces it names, as root (criu/pstree.c,
// prepare_pstree_kobj_ids). The cgroup namespace follows cgroup.img.
func (c *checker) checkNamespaces(image string, ids nsIDs) error {
	for i, id := range ids {
		if nsNames[i] != "cgroup" && id != c.root[i] {
			return refuse(image, "ids."+nsNames[i]+"_ns_id", "%d, not the container's %s namespace (%d): a nested namespace is created by the restore as root", id, nsNames[i], c.root[i])
		}
	}
	return nil
}

// ociNS maps CRIU's namespace names to the spec's.
var ociNS = map[string]specs.LinuxNamespaceType{
	"pid": specs.PIDNamespace, "net": specs.NetworkNamespace, "ipc": specs.IPCNamespace, "uts": specs.UTSNamespace,
	"mnt": specs.MountNamespace, "user": specs.UserNamespace, "time": specs.TimeNamespace,
	"cgroup": specs.CgroupNamespace,
}

// checkRootNamespaces compares the root task's namespaces with CRIU's own
// (the inventory's root_ids): CRIU restores a task in a namespace of its
// own (the host's) wherever the IDs are equal (criu/pstree.c,
// get_clone_mask), so every namespace the spec gives the container must
// differ there; those runc joins by path (ipc, uts, time, mnt, user) are
// joined whatever the image says (criu/namespaces.c, join_namespaces),
// a network or PID namespace given by path is the runtime's only through
// its external key (checkExternalNS), and a cgroup namespace is created by
// CRIU at the root cgroup.img's prefix names (checkCgroup).
func (c *checker) checkRootNamespaces(image string) error {
	inSpec := map[specs.LinuxNamespaceType]bool{}
	if c.p.spec.Linux != nil {
		for _, n := range c.p.spec.Linux.Namespaces {
			inSpec[n.Type] = true
		}
	}
	for i, name := range nsNames {
		t, ok := ociNS[name]
		if !ok {
			continue
		}
		same := c.root[i] == c.criuIDs[i]
		switch {
		case inSpec[t] && same:
			return refuse(image, "ids."+name+"_ns_id", "the restore's own (the host's) %s namespace, and the container has one of its own", name)
		case !inSpec[t] && !same:
			return refuse(image, "ids."+name+"_ns_id", "a %s namespace the container's spec does not create", name)
		}
	}
	return nil
}

// asRefusal makes a decoding error a refusal of image.
func asRefusal(image string, err error) error {
	var r *Refusal
	if errors.As(err, &r) {
		return err
	}
	return refuse(image, "", "%v", err)
}

func bitsOf(words []uint32) (uint64, error) {
	var s uint64
	for i, w := range words {
		if i >= 2 {
			if w != 0 {
				return 0, fmt.Errorf("capability numbers above 63")
			}
			continue
		}
		s |= uint64(w) << (32 * i)
	}
	return s, nil
}
