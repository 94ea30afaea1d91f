package criucheck

import (
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/mm"
	"golang.org/x/sys/unix"
)

// mmapMinAddr is the node's vm.mmap_min_addr, read once: the lowest address
// a process may map without CAP_SYS_RAWIO (security/min_addr.c,
// security/commoncap.c cap_mmap_addr). 65536, the kernel's usual default
// (CONFIG_DEFAULT_MMAP_MIN_ADDR), when it cannot be read. Tests replace it.
var mmapMinAddr = sync.OnceValue(func() uint64 {
	b, err := os.ReadFile("/proc/sys/vm/mmap_min_addr")
	if err == nil {
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return v
		}
	}
	return 65536
})

// VMA status bits (criu/include/image.h).
const (
	vmaFilePrivate = 1 << 6
	vmaFileShared  = 1 << 7
	vmaUprobes     = 1 << 17
	vmaExtPlugin   = 1 << 27
	vmaUnsupp      = 1 << 31
)

// checkMemory reads each task's memory layout (mm-<pid>.img; criu/mem.c,
// criu/files-reg.c for file mappings): a mapping CRIU hands to a plugin or
// to uprobes, or that locks memory without CAP_IPC_LOCK, is refused, and
// every mapped file must be an entry of files.img (checked there). The
// restorer maps every area at its address as root (criu/pie/restorer.c),
// so an area below the node's mmap_min_addr (a page at address 0 turns a
// kernel NULL dereference into code the tenant chose) needs CAP_SYS_RAWIO in
// the spec.
func (c *checker) checkMemory() error {
	for _, name := range c.files["mm"] {
		var m mm.MmEntry
		if err := oneEntry(c.dir, name, "MM", &m); err != nil {
			return asRefusal(name, err)
		}
		if id := m.GetExeFileId(); id != 0 && !c.fileIDs[id] {
			return refuse(name, "exe_file_id", "%d is not a file of files.img", id)
		}
		for i, v := range m.GetVmas() {
			st := v.GetStatus()
			switch {
			case st&(vmaExtPlugin|vmaUprobes|vmaUnsupp) != 0:
				return refuse(name, vmaField(i, "status"), "%#x: a mapping restored by a plugin, a uprobe or not at all", st)
			case v.GetStart() >= v.GetEnd() || v.GetStart()%4096 != 0 || v.GetEnd()%4096 != 0:
				return refuse(name, vmaField(i, "start"), "%#x-%#x is not a page-aligned range", v.GetStart(), v.GetEnd())
			case v.GetStart() < mmapMinAddr() && !c.p.may("CAP_SYS_RAWIO"):
				return refuse(name, vmaField(i, "start"), "%#x is below the node's mmap_min_addr %#x; mapping there needs CAP_SYS_RAWIO", v.GetStart(), mmapMinAddr())
			case v.GetFlags()&(unix.MAP_LOCKED|unix.MAP_HUGETLB) != 0 && !c.p.may("CAP_IPC_LOCK"):
				return refuse(name, vmaField(i, "flags"), "%#x locks or pins memory; it needs CAP_IPC_LOCK", v.GetFlags())
			case st&(vmaFilePrivate|vmaFileShared) != 0 && !c.fileIDs[uint32(v.GetShmid())]:
				return refuse(name, vmaField(i, "shmid"), "%d maps a file that is not in files.img", v.GetShmid())
			}
		}
	}
	return nil
}

func vmaField(i int, f string) string {
	return "vmas[" + itoa(i) + "]." + f
}
