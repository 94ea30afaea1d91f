package criucheck

import (
	"github.com/checkpoint-restore/go-criu/v8/crit/images/cgroup"
	criucore "github.com/checkpoint-restore/go-criu/v8/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	fsimg "github.com/checkpoint-restore/go-criu/v8/crit/images/fs"
	ghostfile "github.com/checkpoint-restore/go-criu/v8/crit/images/ghost-file"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/inventory"
	ipcmsg "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-msg"
	ipcsem "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-sem"
	ipcshm "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-shm"
	ipcvar "github.com/checkpoint-restore/go-criu/v8/crit/images/ipc-var"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/memfd"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mnt"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/netdev"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pidns"
	pipedata "github.com/checkpoint-restore/go-criu/v8/crit/images/pipe-data"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pstree"
	remap "github.com/checkpoint-restore/go-criu/v8/crit/images/remap-file-path"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/seccomp"
	skpacket "github.com/checkpoint-restore/go-criu/v8/crit/images/sk-packet"
	tcpstream "github.com/checkpoint-restore/go-criu/v8/crit/images/tcp-stream"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/timens"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/timerfd"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/tty"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/utsns"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The field rules: an allowlist of what a checkpoint's images may set.
// Every field of every message an image is decoded into has a rule, by its
// protobuf full name (protoreflect's FieldDescriptor.FullName: go-criu's
// messages have no package, so "creds_entry.cap_eff"), or is covered by a
// rule for its whole message ("user_x86_regs_entry"):
//   - checked: a check of this package derives the one acceptable value from
//     the spec, or bounds it; why names the check;
//   - free: the process's own state, which grants nothing beyond what the
//     process could do itself, or a value CRIU uses only to tie entries
//     together or to check what it restored; why says which;
//   - refused: no checkpoint of a container sets it; an image that does is
//     refused.
//
// Decoding (decode.go, entryReader.next) walks every populated field of every
// entry and refuses one whose rule is missing or refused, so a field a newer
// go-criu adds is refused until it is classified here. TestFieldRules walks
// go-criu's descriptors from each decoded image's messages (imageClasses)
// and fails for a field without a rule and for a rule naming nothing.

type fieldClass uint8

const (
	classChecked fieldClass = iota + 1
	classFree
	classRefused
)

type fieldRule struct {
	class fieldClass
	why   string
}

func checked(by string) fieldRule { return fieldRule{classChecked, by} }
func free(why string) fieldRule   { return fieldRule{classFree, why} }
func refused(why string) fieldRule {
	return fieldRule{classRefused, why}
}

// fieldRuleSet maps field and message full names to rules.
type fieldRuleSet map[protoreflect.FullName]fieldRule

// rule is fd's rule: its own, else its message's.
func (rs fieldRuleSet) rule(fd protoreflect.FieldDescriptor) (fieldRule, bool) {
	if r, ok := rs[fd.FullName()]; ok {
		return r, true
	}
	r, ok := rs[fd.ContainingMessage().FullName()]
	return r, ok
}

// Reasons shared by many fields.
const (
	whyRegs = "registers and CPU state the task restores for itself with rt_sigreturn (criu/pie/restorer.c), which the kernel sanitizes as for any process; " +
		"CRIU reads only the node's architecture's (readCore checks mtype)"
	whyID      = "an ID tying entries of the images together; one naming nothing fails the restore"
	whySignals = "signal state the task could set itself (masks, handlers, pending signals it queues to itself)"
	whyFlags   = "the file's status flags (O_NONBLOCK, O_APPEND...), which the process sets itself with fcntl"
	whyPos     = "a file position"
	whyFown    = "the file's owner for SIGIO: fieldchecks.go checkFileFields (a pid of the tree, the uids the process may have)"
	whySockOpt = "a socket option the process sets itself without a capability"
	whySockNS  = "fieldchecks.go checkFileFields: the container's network namespace"
	whyNoType  = "files.go checkFile refuses a file of this kind"
	whyTime    = "a timer's or clock's time"
	whyTerm    = "terminal settings of the tree's own pseudo-terminal"
	whyNetConf = "network sysctls CRIU writes only into a network namespace it creates (criu/net.c, prepare_net_ns_first_stage skips one with ext_key), " +
		"which is the container's own: a namespace the spec names by path must carry runc's key (namespaces.go checkExternalNS)"
	whyCgroup = "cgroup.go checkCgroup"
)

// fieldRules classifies every field of the messages the images are decoded
// into.
var fieldRules = fieldRuleSet{
	// inventory.img
	"inventory_entry.img_version":         free("the image format's version; CRIU refuses one it does not know (criu/image.c, check_img_inventory)"),
	"inventory_entry.fdinfo_per_id":       free("how fdinfo images are named; CRIU refuses images without it"),
	"inventory_entry.root_ids":            checked("tree.go checkInventory, checkRootNamespaces"),
	"inventory_entry.ns_per_id":           checked("nsimages.go checkNSPerID"),
	"inventory_entry.root_cg_set":         checked("fieldchecks.go checkInventoryFields: CRIU's own cgroup set, which no set of cgroup.img may be (a task in it keeps CRIU's cgroup namespace, criu/cgroup.c prepare_cgroup_namespace)"),
	"inventory_entry.lsmtype":             free("the dumping node's LSM; CRIU compares it with the node's"),
	"inventory_entry.dump_uptime":         free("the dumping node's uptime, for parent images, which the restore has none of"),
	"inventory_entry.pre_dump_mode":       free("how pre-dumps read memory; a dump setting"),
	"inventory_entry.tcp_close":           free("CRIU refuses the restore unless told --tcp-close (criu/image.c), which the runtime never passes"),
	"inventory_entry.network_lock_method": free("iptables, nftables or none for CRIU's network lock; the nftables table's name is checked (dump_criu_run_id)"),
	"inventory_entry.plugins_entry":       checked("tree.go checkInventory: no plugins"),
	"inventory_entry.dump_criu_run_id":    checked("fieldchecks.go checkInventoryFields: a UUID, as CRIU writes it; CRIU builds an nftables command from it (criu/netfilter.c, nftables_get_table)"),
	"inventory_entry.allow_uprobes":       free("CRIU refuses the restore unless told --allow-uprobes (criu/image.c); uprobe mappings are refused (memory.go checkMemory)"),
	"plugins_entry.plugins":               checked("tree.go checkInventory: none"),

	// ids-<pid>.img, core_entry.ids
	"task_kobj_ids_entry.vm_id":        free("which tasks of the tree share memory (CLONE_VM)"),
	"task_kobj_ids_entry.files_id":     free("which tasks of the tree share a descriptor table (CLONE_FILES); names the fdinfo image"),
	"task_kobj_ids_entry.fs_id":        free("which tasks of the tree share root, cwd and umask (CLONE_FS)"),
	"task_kobj_ids_entry.sighand_id":   free("which tasks of the tree share signal handlers (CLONE_SIGHAND)"),
	"task_kobj_ids_entry.pid_ns_id":    checked("tree.go checkNamespaces, checkRootNamespaces"),
	"task_kobj_ids_entry.net_ns_id":    checked("tree.go checkNamespaces, checkRootNamespaces"),
	"task_kobj_ids_entry.ipc_ns_id":    checked("tree.go checkNamespaces, checkRootNamespaces"),
	"task_kobj_ids_entry.uts_ns_id":    checked("tree.go checkNamespaces, checkRootNamespaces"),
	"task_kobj_ids_entry.mnt_ns_id":    checked("tree.go checkNamespaces, checkRootNamespaces"),
	"task_kobj_ids_entry.user_ns_id":   checked("tree.go checkNamespaces, checkRootNamespaces"),
	"task_kobj_ids_entry.cgroup_ns_id": checked("tree.go checkRootNamespaces; cgroup.go checkCgroup"),
	"task_kobj_ids_entry.time_ns_id":   checked("tree.go checkNamespaces, checkRootNamespaces"),

	// pstree.img
	"pstree_entry.pid":     checked("tree.go checkTree"),
	"pstree_entry.ppid":    free("the tree's shape; a parent outside it fails the restore (criu/pstree.c)"),
	"pstree_entry.pgid":    checked("tree.go checkTree"),
	"pstree_entry.sid":     checked("tree.go checkTree"),
	"pstree_entry.threads": checked("tree.go checkTree, checkZombie"),

	// core-<tid>.img
	"core_entry.mtype":          checked("tree.go readCore: the node's architecture"),
	"core_entry.thread_info":    free(whyRegs),
	"core_entry.ti_arm":         free(whyRegs),
	"core_entry.ti_aarch64":     free(whyRegs),
	"core_entry.ti_ppc64":       free(whyRegs),
	"core_entry.ti_s390":        free(whyRegs),
	"core_entry.ti_mips":        free(whyRegs),
	"core_entry.ti_loongarch64": free(whyRegs),
	"core_entry.ti_riscv64":     free(whyRegs),
	"core_entry.tc":             checked("tree.go checkThread, task.go checkTask"),
	"core_entry.ids":            checked("tree.go taskIDs"),
	"core_entry.thread_core":    checked("tree.go checkThread"),

	"thread_info_x86":                   free(whyRegs),
	"user_x86_regs_entry":               free(whyRegs),
	"user_x86_fpregs_entry":             free(whyRegs),
	"user_x86_xsave_entry":              free(whyRegs),
	"user_x86_cet_entry":                free(whyRegs + "; the shadow stack is the task's own control-flow protection"),
	"user_desc_t":                       free(whyRegs + "; TLS descriptors the task sets with set_thread_area"),
	"thread_info_arm":                   free(whyRegs),
	"user_arm_regs_entry":               free(whyRegs),
	"user_arm_vfpstate_entry":           free(whyRegs),
	"thread_info_aarch64":               free(whyRegs),
	"user_aarch64_regs_entry":           free(whyRegs),
	"user_aarch64_fpsimd_context_entry": free(whyRegs),
	"pac_keys":                          free(whyRegs + "; pointer authentication keys are the task's own"),
	"pac_address_keys":                  free(whyRegs),
	"pac_generic_keys":                  free(whyRegs),
	"thread_info_ppc64":                 free(whyRegs),
	"user_ppc64_regs_entry":             free(whyRegs),
	"user_ppc64_fpstate_entry":          free(whyRegs),
	"user_ppc64_vrstate_entry":          free(whyRegs),
	"user_ppc64_vsxstate_entry":         free(whyRegs),
	"user_ppc64_tm_regs_entry":          free(whyRegs),
	"thread_info_s390":                  free(whyRegs),
	"user_s390_regs_entry":              free(whyRegs),
	"user_s390_fpregs_entry":            free(whyRegs),
	"user_s390_vxrs_low_entry":          free(whyRegs),
	"user_s390_vxrs_high_entry":         free(whyRegs),
	"user_s390_gs_cb_entry":             free(whyRegs),
	"user_s390_ri_entry":                free(whyRegs),
	"thread_info_mips":                  free(whyRegs),
	"user_mips_regs_entry":              free(whyRegs),
	"user_mips_fpregs_entry":            free(whyRegs),
	"thread_info_loongarch64":           free(whyRegs),
	"user_loongarch64_gpregs_entry":     free(whyRegs),
	"user_loongarch64_fpregs_entry":     free(whyRegs),
	"thread_info_riscv64":               free(whyRegs),
	"user_riscv64_regs_entry":           free(whyRegs),
	"user_riscv64_d_ext_entry":          free(whyRegs),

	"task_core_entry.task_state":                   checked("tree.go checkTree: live or dead, not the root dead"),
	"task_core_entry.exit_code":                    free("a dead task's exit code"),
	"task_core_entry.personality":                  free("personality(2) flags the task sets itself; the kernel clears the unsafe ones on a set-ID exec"),
	"task_core_entry.flags":                        free("the task's kernel flags as dumped; the restore sets none of them"),
	"task_core_entry.blk_sigset":                   free(whySignals),
	"task_core_entry.blk_sigset_extended":          free(whySignals),
	"task_core_entry.comm":                         free("the task's name (PR_SET_NAME)"),
	"task_core_entry.timers":                       checked("fieldchecks.go checkTaskTimers"),
	"task_core_entry.rlimits":                      checked("task.go checkTask"),
	"task_core_entry.cg_set":                       checked(whyCgroup + ": every set of cgroup.img is in the container's cgroup"),
	"task_core_entry.signals_s":                    free(whySignals),
	"task_core_entry.old_seccomp_mode":             checked("tree.go checkThread, seccomp.go checkSeccompMode"),
	"task_core_entry.old_seccomp_filter":           checked("tree.go checkThread, seccomp.go checkSeccomp"),
	"task_core_entry.loginuid":                     checked("task.go checkTask"),
	"task_core_entry.oom_score_adj":                checked("task.go checkTask"),
	"task_core_entry.sigactions":                   free(whySignals),
	"task_core_entry.child_subreaper":              free("PR_SET_CHILD_SUBREAPER, which a task sets itself"),
	"task_core_entry.stop_signo":                   free("the signal a stopped task was stopped by"),
	"task_core_entry.membarrier_registration_mask": free("membarrier(2) registrations, which a task makes itself"),

	"task_timers_entry.real":  free(whyTime + " (setitimer)"),
	"task_timers_entry.virt":  free(whyTime + " (setitimer)"),
	"task_timers_entry.prof":  free(whyTime + " (setitimer)"),
	"task_timers_entry.posix": checked("fieldchecks.go checkTaskTimers"),
	"itimer_entry":            free(whyTime),
	"posix_timer_entry.it_id": free("the timer's ID, which timer_create recreates"),
	"posix_timer_entry.clock_id": checked("fieldchecks.go checkTaskTimers: an alarm clock needs CAP_WAKE_ALARM; " +
		"the restorer creates timers before it drops to the task's credentials (criu/pie/restorer.c)"),
	"posix_timer_entry.si_signo":         free(whySignals),
	"posix_timer_entry.it_sigev_notify":  free("how the timer notifies the task"),
	"posix_timer_entry.sival_ptr":        free("the value the timer's signal carries"),
	"posix_timer_entry.overrun":          free("the timer's overrun count"),
	"posix_timer_entry.isec":             free(whyTime),
	"posix_timer_entry.insec":            free(whyTime),
	"posix_timer_entry.vsec":             free(whyTime),
	"posix_timer_entry.vnsec":            free(whyTime),
	"posix_timer_entry.notify_thread_id": free("the thread of the task the timer signals (SIGEV_THREAD_ID takes a thread of the caller's group)"),

	"task_rlimits_entry.rlimits": checked("task.go checkTask"),
	"rlimit_entry.cur":           free("a soft limit, which setrlimit keeps at most the hard limit"),
	"rlimit_entry.max":           checked("task.go checkTask"),
	"signal_queue_entry.signals": free(whySignals),
	"siginfo_entry.siginfo":      free(whySignals + ": the restorer queues each to the task itself, as rt_sigqueueinfo lets any task"),
	"sa_entry":                   free(whySignals),

	"thread_core_entry.futex_rla":           free("the robust futex list (set_robust_list)"),
	"thread_core_entry.futex_rla_len":       free("the robust futex list (set_robust_list)"),
	"thread_core_entry.sched_nice":          checked("task.go checkSched"),
	"thread_core_entry.sched_policy":        checked("task.go checkSched"),
	"thread_core_entry.sched_prio":          checked("task.go checkSched: a real-time priority only with a real-time policy, which needs CAP_SYS_NICE"),
	"thread_core_entry.blk_sigset":          free(whySignals),
	"thread_core_entry.blk_sigset_extended": free(whySignals),
	"thread_core_entry.sas":                 free("the signal stack (sigaltstack)"),
	"thread_core_entry.pdeath_sig":          free("PR_SET_PDEATHSIG, which a task sets itself"),
	"thread_core_entry.signals_p":           free(whySignals),
	"thread_core_entry.creds":               checked("creds.go checkCreds"),
	"thread_core_entry.seccomp_mode":        checked("seccomp.go checkSeccompMode"),
	"thread_core_entry.seccomp_filter":      checked("seccomp.go checkSeccomp"),
	"thread_core_entry.comm":                free("the thread's name (PR_SET_NAME)"),
	"thread_core_entry.rseq_entry":          free("the thread's rseq(2) registration, which it makes itself"),
	"thread_core_entry.cg_set":              checked(whyCgroup + ": every set of cgroup.img is in the container's cgroup"),
	"thread_sas_entry":                      free("the signal stack (sigaltstack)"),
	"rseq_entry":                            free("the thread's rseq(2) registration, which it makes itself"),

	"creds_entry.uid":            checked("creds.go checkCreds"),
	"creds_entry.gid":            checked("creds.go checkCreds"),
	"creds_entry.euid":           checked("creds.go checkCreds"),
	"creds_entry.egid":           checked("creds.go checkCreds"),
	"creds_entry.suid":           checked("creds.go checkCreds"),
	"creds_entry.sgid":           checked("creds.go checkCreds"),
	"creds_entry.fsuid":          checked("creds.go checkCreds"),
	"creds_entry.fsgid":          checked("creds.go checkCreds"),
	"creds_entry.cap_inh":        checked("creds.go checkCreds"),
	"creds_entry.cap_prm":        checked("creds.go checkCreds"),
	"creds_entry.cap_eff":        checked("creds.go checkCreds"),
	"creds_entry.cap_bnd":        checked("creds.go checkCreds"),
	"creds_entry.cap_amb":        checked("creds.go checkCreds"),
	"creds_entry.secbits":        checked("creds.go checkCreds"),
	"creds_entry.groups":         checked("creds.go checkCreds"),
	"creds_entry.lsm_profile":    checked("creds.go checkCreds, lsmMatches"),
	"creds_entry.lsm_sockcreate": checked("creds.go lsmMatches: none"),
	"creds_entry.apparmor_data":  checked("creds.go lsmMatches: none"),
	"creds_entry.no_new_privs":   checked("creds.go checkCreds"),

	// seccomp.img
	"seccomp_entry.seccomp_filters": checked("seccomp.go checkSeccomp"),
	"seccomp_filter.filter":         checked("seccomp_bpf.go checkChain"),
	"seccomp_filter.prev":           checked("seccomp.go checkSeccomp"),
	"seccomp_filter.flags":          checked("seccomp_bpf.go checkChain: SPEC_ALLOW only with the profile's; the others (TSYNC, LOG, NEW_LISTENER) shape the task's own filtering"),

	// netns-<id>.img, pidns-<id>.img
	"netns_entry.def_conf":    free(whyNetConf),
	"netns_entry.all_conf":    free(whyNetConf),
	"netns_entry.def_conf4":   free(whyNetConf),
	"netns_entry.all_conf4":   free(whyNetConf),
	"netns_entry.def_conf6":   free(whyNetConf),
	"netns_entry.all_conf6":   free(whyNetConf),
	"netns_entry.unix_conf":   free(whyNetConf),
	"netns_entry.ipv4_sysctl": free(whyNetConf),
	"netns_entry.nsids":       free(whyNetConf),
	"netns_entry.ext_key":     checked("namespaces.go checkExternalNS"),
	"sysctl_entry":            free(whyNetConf),
	"netns_id":                free(whyNetConf),
	"pidns_entry.ext_key":     checked("namespaces.go checkExternalNS"),

	// files.img
	"file_entry.type":  checked("files.go checkFile"),
	"file_entry.id":    free(whyID),
	"file_entry.reg":   checked("files.go checkFile"),
	"file_entry.isk":   checked("files.go checkFile"),
	"file_entry.nsf":   refused(whyNoType),
	"file_entry.psk":   checked("files.go checkFile: CAP_NET_RAW"),
	"file_entry.nlsk":  checked("files.go checkFile"),
	"file_entry.efd":   free("an eventfd of the tree"),
	"file_entry.epfd":  free("an epoll instance of the tree"),
	"file_entry.sgfd":  free("a signalfd of the tree"),
	"file_entry.tunf":  checked("files.go checkFile: CAP_NET_ADMIN"),
	"file_entry.tfd":   checked("files.go checkFile"),
	"file_entry.ify":   checked("files.go checkFile"),
	"file_entry.ffy":   refused(whyNoType),
	"file_entry.ext":   refused(whyNoType),
	"file_entry.usk":   checked("files.go checkFile"),
	"file_entry.fifo":  free("a FIFO of the tree; its path is a regular file entry of its own"),
	"file_entry.pipe":  free("a pipe of the tree"),
	"file_entry.tty":   free("a terminal of the tree; its path is a regular file entry of its own, its kind tty-info.img's"),
	"file_entry.memfd": free("a memfd of the tree; its inode is memfd.img's"),
	"file_entry.bpf":   refused(whyNoType),
	"file_entry.pidfd": checked("files.go checkFile"),

	"reg_file_entry.id":    free(whyID),
	"reg_file_entry.flags": checked("files.go checkFile; access.go CheckAccess"),
	"reg_file_entry.pos":   free(whyPos),
	"reg_file_entry.fown":  checked(whyFown),
	"reg_file_entry.name":  checked("files.go checkFile, paths.go openPathWhy; access.go CheckAccess"),
	"reg_file_entry.mnt_id": free("the mount whose namespace root CRIU opens the path from: the container's, the only mount namespace (tree.go checkNamespaces); " +
		"for a ghost remap, the mount CRIU may remount writable while it unlinks the ghost (criu/files-reg.c, try_remount_writable)"),
	"reg_file_entry.size":               free("compared by CRIU with the file it opens (criu/files-reg.c, validate_file)"),
	"reg_file_entry.ext":                checked("files.go checkFile: not external"),
	"reg_file_entry.mode":               free("compared by CRIU with the file it opens"),
	"reg_file_entry.build_id":           free("compared by CRIU with the file it opens"),
	"reg_file_entry.checksum":           free("compared by CRIU with the file it opens"),
	"reg_file_entry.checksum_config":    free("how CRIU compares the file it opens"),
	"reg_file_entry.checksum_parameter": free("how CRIU compares the file it opens"),

	"fown_entry.uid":      checked(whyFown),
	"fown_entry.euid":     checked(whyFown),
	"fown_entry.signum":   free("the signal SIGIO is replaced by (F_SETSIG)"),
	"fown_entry.pid_type": free("whether the owner is a thread, a process or a group"),
	"fown_entry.pid":      checked(whyFown),

	"inet_sk_entry.id":           free(whyID),
	"inet_sk_entry.ino":          free(whyID),
	"inet_sk_entry.family":       free("the address family"),
	"inet_sk_entry.type":         checked("files.go checkFile: raw sockets need CAP_NET_RAW"),
	"inet_sk_entry.proto":        free("the protocol of a socket of its type"),
	"inet_sk_entry.state":        free("listening, connected or closed; a connected TCP socket CRIU restores only with --tcp-established, which the runtime never passes (criu/sk-inet.c)"),
	"inet_sk_entry.src_port":     checked("files.go checkFile: CAP_NET_BIND_SERVICE below 1024"),
	"inet_sk_entry.dst_port":     free("the peer the socket connects to"),
	"inet_sk_entry.flags":        free(whyFlags),
	"inet_sk_entry.backlog":      free("the listen backlog, which the kernel caps"),
	"inet_sk_entry.src_addr":     free("the local address, bound in the pod's network namespace (IP_FREEBIND needs no capability)"),
	"inet_sk_entry.dst_addr":     free("the peer the socket connects to"),
	"inet_sk_entry.fown":         checked(whyFown),
	"inet_sk_entry.opts":         checked("fieldchecks.go checkFileFields, files.go checkSockOpts"),
	"inet_sk_entry.v6only":       free(whySockOpt),
	"inet_sk_entry.ip_opts":      free(whySockOpt),
	"inet_sk_entry.ifname":       free("SO_BINDTODEVICE to a device of the pod's network namespace, which an unbound socket sets without a capability"),
	"inet_sk_entry.ns_id":        checked(whySockNS),
	"inet_sk_entry.shutdown":     free("which directions were shut down"),
	"inet_sk_entry.tcp_opts":     free(whySockOpt),
	"ip_opts_entry":              free(whySockOpt + " (IP_FREEBIND, IP_PKTINFO, IP_TOS, IP_TTL)"),
	"ip_opts_raw_entry":          free("options of a raw socket, which needs CAP_NET_RAW (files.go checkFile)"),
	"tcp_opts_entry":             free(whySockOpt),
	"sk_opts_entry.so_sndbuf":    free("the send buffer's size; CRIU forces it (SO_SNDBUFFORCE), and the memory a socket queues is charged to the container's memory cgroup"),
	"sk_opts_entry.so_rcvbuf":    free("the receive buffer's size; CRIU forces it (SO_RCVBUFFORCE), and the memory a socket queues is charged to the container's memory cgroup"),
	"sk_opts_entry.so_priority":  checked("fieldchecks.go checkFileFields, files.go checkSockOpts: above 6 needs CAP_NET_ADMIN"),
	"sk_opts_entry.so_mark":      checked("fieldchecks.go checkFileFields, files.go checkSockOpts: CAP_NET_ADMIN"),
	"sk_opts_entry.so_bound_dev": free("SO_BINDTODEVICE to a device of the pod's network namespace, which an unbound socket sets without a capability"),
	"sk_opts_entry.so_filter":    free("a classic BPF socket filter (SO_ATTACH_FILTER), which needs no capability"),
	"sk_opts_entry":              free(whySockOpt + " (timeouts, SO_REUSEADDR, SO_KEEPALIVE, SO_LINGER...)"),

	"ns_file_entry":           refused(whyNoType),
	"packet_sock_entry":       free("options of a packet socket, which the container has only with CAP_NET_RAW (files.go checkFile), and sets itself with it"),
	"packet_sock_entry.fown":  checked(whyFown),
	"packet_sock_entry.opts":  checked("fieldchecks.go checkFileFields, files.go checkSockOpts"),
	"packet_sock_entry.ns_id": checked(whySockNS),
	"packet_mclist":           free("a packet socket's multicast list (CAP_NET_RAW, files.go checkFile)"),
	"packet_ring":             free("a packet socket's ring (CAP_NET_RAW, files.go checkFile)"),

	"netlink_sk_entry.id":         free(whyID),
	"netlink_sk_entry.ino":        free(whyID),
	"netlink_sk_entry.protocol":   checked("files.go checkFile"),
	"netlink_sk_entry.state":      free("bound or connected"),
	"netlink_sk_entry.flags":      free(whyFlags),
	"netlink_sk_entry.portid":     free("the port the socket binds; any free port is the process's to take"),
	"netlink_sk_entry.groups":     checked("files.go checkFile: CAP_NET_ADMIN"),
	"netlink_sk_entry.dst_portid": free("the unicast port the socket connects to"),
	"netlink_sk_entry.dst_group":  checked("fieldchecks.go checkFileFields: connecting to a multicast group needs CAP_NET_ADMIN"),
	"netlink_sk_entry.fown":       checked(whyFown),
	"netlink_sk_entry.opts":       checked("fieldchecks.go checkFileFields, files.go checkSockOpts"),
	"netlink_sk_entry.ns_id":      checked(whySockNS),

	"eventfd_file_entry.id":      free(whyID),
	"eventfd_file_entry.flags":   free(whyFlags),
	"eventfd_file_entry.fown":    checked(whyFown),
	"eventfd_file_entry.counter": free("the eventfd's counter"),
	"eventpoll_file_entry.id":    free(whyID),
	"eventpoll_file_entry.flags": free(whyFlags),
	"eventpoll_file_entry.fown":  checked(whyFown),
	"eventpoll_file_entry.tfd":   checked("fieldchecks.go checkFileFields"),
	"eventpoll_tfd_entry.events": checked("fieldchecks.go checkFileFields: EPOLLWAKEUP needs CAP_BLOCK_SUSPEND " +
		"(epoll_ctl drops it for a process without, not for CRIU as root)"),
	"eventpoll_tfd_entry":         free("an epoll watch of a descriptor of the tree: which descriptor, and the data it returns"),
	"signalfd_entry.id":           free(whyID),
	"signalfd_entry.flags":        free(whyFlags),
	"signalfd_entry.fown":         checked(whyFown),
	"signalfd_entry.sigmask":      free(whySignals),
	"tunfile_entry.id":            free(whyID),
	"tunfile_entry.netdev":        free("the tun device of the pod's network namespace the file attaches to (CAP_NET_ADMIN, files.go checkFile)"),
	"tunfile_entry.detached":      free("a tun queue detached by the process (CAP_NET_ADMIN, files.go checkFile)"),
	"tunfile_entry.ns_id":         checked(whySockNS),
	"timerfd_entry.id":            free(whyID),
	"timerfd_entry.flags":         free(whyFlags),
	"timerfd_entry.fown":          checked(whyFown),
	"timerfd_entry.clockid":       checked("files.go checkFile; fieldchecks.go checkFileFields for timerfd.img: an alarm clock needs CAP_WAKE_ALARM"),
	"timerfd_entry.ticks":         free(whyTime),
	"timerfd_entry.settime_flags": free("TFD_TIMER_ABSTIME, TFD_TIMER_CANCEL_ON_SET"),
	"timerfd_entry.vsec":          free(whyTime),
	"timerfd_entry.vnsec":         free(whyTime),
	"timerfd_entry.isec":          free(whyTime),
	"timerfd_entry.insec":         free(whyTime),

	"inotify_file_entry.id":         free(whyID),
	"inotify_file_entry.flags":      free(whyFlags),
	"inotify_file_entry.fown":       checked(whyFown),
	"inotify_file_entry.wd":         checked("files.go checkFile"),
	"inotify_wd_entry.id":           free(whyID),
	"inotify_wd_entry.i_ino":        free("identifies the watched file; CRIU opens it by its path (checked), by handle only without one, which files.go checkFile refuses"),
	"inotify_wd_entry.s_dev":        free("identifies the watched file; CRIU opens it by its path (checked), by handle only without one, which files.go checkFile refuses"),
	"inotify_wd_entry.mask":         free("the events watched, which any process may ask for"),
	"inotify_wd_entry.ignored_mask": free("the events ignored"),
	"inotify_wd_entry.wd":           free("the watch descriptor's number"),
	"inotify_wd_entry.f_handle":     checked("files.go checkFile"),
	"fh_entry.bytes":                free("a file handle, used only without a path, which files.go checkFile refuses"),
	"fh_entry.type":                 free("a file handle, used only without a path, which files.go checkFile refuses"),
	"fh_entry.handle":               free("a file handle, used only without a path, which files.go checkFile refuses"),
	"fh_entry.path":                 checked("files.go checkFile, paths.go openPathWhy; access.go CheckAccess"),
	"fh_entry.mnt_id":               free("the mount whose namespace root CRIU opens the path from: the container's, the only mount namespace"),
	"fanotify_file_entry":           refused(whyNoType),
	"fanotify_mark_entry":           refused(whyNoType),
	"fanotify_inode_mark_entry":     refused(whyNoType),
	"fanotify_mount_mark_entry":     refused(whyNoType),
	"ext_file_entry":                refused(whyNoType),

	"unix_sk_entry.id":         free(whyID),
	"unix_sk_entry.ino":        free(whyID),
	"unix_sk_entry.type":       free("stream, datagram or seqpacket"),
	"unix_sk_entry.state":      free("listening, connected or closed"),
	"unix_sk_entry.flags":      free(whyFlags),
	"unix_sk_entry.uflags":     checked("files.go checkFile: none"),
	"unix_sk_entry.backlog":    free("the listen backlog, which the kernel caps"),
	"unix_sk_entry.peer":       free("the socket of the tree it is connected to; a peer outside the tree fails the restore without --ext-unix-sk, which the runtime never passes"),
	"unix_sk_entry.fown":       checked(whyFown),
	"unix_sk_entry.opts":       checked("fieldchecks.go checkFileFields, files.go checkSockOpts"),
	"unix_sk_entry.name":       checked("files.go checkFile, paths.go uskPath; access.go CheckAccess"),
	"unix_sk_entry.shutdown":   free("which directions were shut down"),
	"unix_sk_entry.file_perms": free("the owner and mode of the socket's file, which grant only connecting to the tree's own socket"),
	"unix_sk_entry.name_dir":   checked("paths.go uskPath"),
	"unix_sk_entry.deleted":    free("the socket's file was unlinked; CRIU unlinks it after binding"),
	"unix_sk_entry.ns_id":      checked(whySockNS),
	"unix_sk_entry.mnt_id":     free("the mount whose namespace root CRIU binds the name from: the container's, the only mount namespace"),
	"file_perms_entry":         free("the owner and mode of a unix socket's file, which grant only connecting to the tree's own socket"),

	"fifo_entry":                 free("a FIFO of the tree: its pipe and the regular file entry of its path (checked as one)"),
	"pipe_entry.id":              free(whyID),
	"pipe_entry.pipe_id":         free(whyID),
	"pipe_entry.flags":           free(whyFlags),
	"pipe_entry.fown":            checked(whyFown),
	"tty_file_entry.id":          free(whyID),
	"tty_file_entry.tty_info_id": free(whyID),
	"tty_file_entry.flags":       free(whyFlags),
	"tty_file_entry.fown":        checked(whyFown),
	"tty_file_entry.regf_id":     free("the regular file entry of the terminal's path (checked as one)"),
	"memfd_file_entry.id":        free(whyID),
	"memfd_file_entry.flags":     free(whyFlags),
	"memfd_file_entry.pos":       free(whyPos),
	"memfd_file_entry.fown":      checked(whyFown),
	"memfd_file_entry.inode_id":  free(whyID),
	"bpfmap_file_entry":          refused(whyNoType),
	"pidfd_entry.id":             free(whyID),
	"pidfd_entry.ino":            free(whyID),
	"pidfd_entry.flags":          free(whyFlags),
	"pidfd_entry.nspid":          checked("files.go checkFile: a process of the tree"),
	"pidfd_entry.fown":           checked(whyFown),

	// fdinfo-<files_id>.img
	"fdinfo_entry.id":                     free("the file of files.img the descriptor holds; CRIU fails on one it cannot find"),
	"fdinfo_entry.flags":                  free("FD_CLOEXEC"),
	"fdinfo_entry.type":                   free("the kind of the file it holds, which CRIU matches with files.img's"),
	"fdinfo_entry.fd":                     free("the descriptor's number"),
	"fdinfo_entry.xattr_security_selinux": checked("fieldchecks.go checkFdinfo: the spec's SELinux label (CRIU creates the socket with it as its context, criu/lsm.c run_setsockcreatecon)"),

	// mountpoints-<id>.img
	"mnt_entry.fstype":        checked("mounts.go checkMount"),
	"mnt_entry.mnt_id":        free("the mount's ID, which parent_mnt_id, files and the tmpfs images name"),
	"mnt_entry.root_dev":      free("the mount's device: which mount of the tree CRIU binds a mount of the same file system from (criu/mount.c, mnt_bind_pick), at a path below that mount's root"),
	"mnt_entry.parent_mnt_id": free("the tree's shape; every mountpoint is checked"),
	"mnt_entry.flags":         checked("mounts.go checkMount, checkFlags"),
	"mnt_entry.root":          checked("mounts.go checkMount"),
	"mnt_entry.mountpoint":    checked("mounts.go checkMount, checkMounts"),
	"mnt_entry.source":        free("the source name of a fresh kernel file system (proc, sysfs, tmpfs, devpts, mqueue, cgroup), which ignores it; external mounts take the runtime's"),
	"mnt_entry.options": checked("fieldchecks.go checkMountOptions: a cgroup mount's options are its controllers (no release_agent, no new named hierarchy); " +
		"the others' apply to the new superblock alone"),
	"mnt_entry.shared_id":        checked("mounts.go checkMount"),
	"mnt_entry.master_id":        checked("mounts.go checkMount"),
	"mnt_entry.with_plugin":      checked("mounts.go checkMount: not set"),
	"mnt_entry.ext_mount":        checked("mounts.go checkMount"),
	"mnt_entry.fsname":           checked("mounts.go checkMount: none"),
	"mnt_entry.internal_sharing": checked("mounts.go checkMount: not set"),
	"mnt_entry.deleted":          checked("mounts.go checkMount: not set"),
	"mnt_entry.sb_flags":         free("superblock flags (ro, sync, lazytime...) of a fresh kernel file system, which apply to that new superblock alone"),
	"mnt_entry.ext_key":          checked("mounts.go checkMount"),

	// ghost-file-<id>.img (its first entry; the file's data follows)
	"ghost_file_entry.uid":           free("the owner of the deleted file the restore recreates; its mode has no set-ID bits (contents.go checkGhosts), so an owner grants nothing"),
	"ghost_file_entry.gid":           free("the group of the deleted file the restore recreates; its mode has no set-ID bits (contents.go checkGhosts), so a group grants nothing"),
	"ghost_file_entry.mode":          checked("contents.go checkGhosts"),
	"ghost_file_entry.dev":           free("identifies the original file"),
	"ghost_file_entry.ino":           free("identifies the original file"),
	"ghost_file_entry.rdev":          free("a device node's numbers; contents.go checkGhosts refuses device nodes"),
	"ghost_file_entry.atim":          free("the deleted file's times"),
	"ghost_file_entry.mtim":          free("the deleted file's times"),
	"ghost_file_entry.chunks":        free("how the file's data is laid out in the image"),
	"ghost_file_entry.size":          free("the file's size"),
	"ghost_file_entry.symlnk_target": refused("only a symbolic link has a target, and contents.go checkGhosts refuses ghost links"),
	"timeval":                        free("a time"),

	// mm-<pid>.img
	"mm_entry.mm_start_code":  free("the task's memory layout, set with PR_SET_MM_MAP, which the kernel validates (kernel/sys.c, validate_prctl_map_addr)"),
	"mm_entry.mm_end_code":    free("the task's memory layout (PR_SET_MM_MAP, validated by the kernel)"),
	"mm_entry.mm_start_data":  free("the task's memory layout (PR_SET_MM_MAP, validated by the kernel)"),
	"mm_entry.mm_end_data":    free("the task's memory layout (PR_SET_MM_MAP, validated by the kernel)"),
	"mm_entry.mm_start_stack": free("the task's memory layout (PR_SET_MM_MAP, validated by the kernel)"),
	"mm_entry.mm_start_brk":   free("the task's memory layout (PR_SET_MM_MAP, validated by the kernel)"),
	"mm_entry.mm_brk":         free("the task's memory layout (PR_SET_MM_MAP, validated by the kernel)"),
	"mm_entry.mm_arg_start":   free("the task's memory layout (PR_SET_MM_MAP, validated by the kernel)"),
	"mm_entry.mm_arg_end":     free("the task's memory layout (PR_SET_MM_MAP, validated by the kernel)"),
	"mm_entry.mm_env_start":   free("the task's memory layout (PR_SET_MM_MAP, validated by the kernel)"),
	"mm_entry.mm_env_end":     free("the task's memory layout (PR_SET_MM_MAP, validated by the kernel)"),
	"mm_entry.exe_file_id":    checked("memory.go checkMemory; access.go CheckAccess"),
	"mm_entry.mm_saved_auxv":  free("the auxiliary vector the task reads back (PR_SET_MM_MAP)"),
	"mm_entry.vmas":           checked("memory.go checkMemory"),
	"mm_entry.dumpable":       free("PR_SET_DUMPABLE, which takes only 0 or 1"),
	"mm_entry.aios":           free("the task's AIO rings, which io_setup bounds by fs.aio-max-nr"),
	"mm_entry.thp_disabled":   free("PR_SET_THP_DISABLE, which a task sets itself"),
	"aio_ring_entry":          free("the task's AIO rings, which io_setup bounds by fs.aio-max-nr"),
	"vma_entry.start":         checked("memory.go checkMemory"),
	"vma_entry.end":           checked("memory.go checkMemory"),
	"vma_entry.pgoff":         free("the offset of a mapping in its file"),
	"vma_entry.shmid":         checked("memory.go checkMemory"),
	"vma_entry.prot":          free("the mapping's protection; the kernel refuses PROT_EXEC of a file on a noexec mount"),
	"vma_entry.flags":         checked("memory.go checkMemory"),
	"vma_entry.status":        checked("memory.go checkMemory"),
	"vma_entry.fd":            free("a descriptor number of the dump"),
	"vma_entry.madv":          free("madvise(2) advice, which a task gives itself"),
	"vma_entry.fdflags":       checked("access.go CheckAccess: a shared mapping of a file opened for writing needs write access (mappedWrites)"),

	// fs-<pid>.img, remap-fpath.img
	"fs_entry.cwd_id":                  checked("taskfiles.go checkFS"),
	"fs_entry.root_id":                 checked("taskfiles.go checkFS"),
	"fs_entry.umask":                   checked("taskfiles.go checkFS"),
	"remap_file_path_entry.orig_id":    checked("taskfiles.go checkRemaps"),
	"remap_file_path_entry.remap_id":   checked("taskfiles.go checkRemaps"),
	"remap_file_path_entry.remap_type": checked("taskfiles.go checkRemaps"),

	// tty-info.img, tty-data.img
	"tty_info_entry.id":             free(whyID),
	"tty_info_entry.type":           checked("files.go checkFiles"),
	"tty_info_entry.locked":         free(whyTerm),
	"tty_info_entry.exclusive":      free(whyTerm),
	"tty_info_entry.packet_mode":    free(whyTerm),
	"tty_info_entry.sid":            free("the terminal's session, a session of the tree"),
	"tty_info_entry.pgrp":           free("the terminal's foreground group, a group of the tree"),
	"tty_info_entry.rdev":           checked("fieldchecks.go checkTTYDevices: the device of the entry's kind (CRIU picks its driver by it, criu/tty.c get_tty_driver)"),
	"tty_info_entry.termios":        free(whyTerm),
	"tty_info_entry.termios_locked": free(whyTerm),
	"tty_info_entry.winsize":        free(whyTerm),
	"tty_info_entry.pty":            free(whyTerm),
	"tty_info_entry.dev":            free("the device of the terminal's devpts"),
	"tty_info_entry.uid":            free("the owner of the tree's pseudo-terminal, in the container's own devpts"),
	"tty_info_entry.gid":            free("the group of the tree's pseudo-terminal, in the container's own devpts"),
	"termios_entry":                 free(whyTerm),
	"winsize_entry":                 free(whyTerm),
	"tty_pty_entry":                 free(whyTerm),
	"tty_data_entry":                free("bytes queued on the tree's own terminal"),

	// utsns-, ipcns-var-, timens-<id>.img
	"utsns_entry.nodename":             checked("nsimages.go checkUTS"),
	"utsns_entry.domainname":           checked("nsimages.go checkUTS"),
	"ipc_var_entry.sem_ctls":           checked("nsimages.go checkIPC"),
	"ipc_var_entry.msg_ctlmax":         checked("nsimages.go checkIPC"),
	"ipc_var_entry.msg_ctlmnb":         checked("nsimages.go checkIPC"),
	"ipc_var_entry.msg_ctlmni":         checked("nsimages.go checkIPC"),
	"ipc_var_entry.auto_msgmni":        checked("nsimages.go checkIPC"),
	"ipc_var_entry.shm_ctlmax":         checked("nsimages.go checkIPC"),
	"ipc_var_entry.shm_ctlall":         checked("nsimages.go checkIPC"),
	"ipc_var_entry.shm_ctlmni":         checked("nsimages.go checkIPC"),
	"ipc_var_entry.shm_rmid_forced":    checked("nsimages.go checkIPC"),
	"ipc_var_entry.mq_queues_max":      checked("nsimages.go checkIPC"),
	"ipc_var_entry.mq_msg_max":         checked("nsimages.go checkIPC"),
	"ipc_var_entry.mq_msgsize_max":     checked("nsimages.go checkIPC"),
	"ipc_var_entry.mq_msg_default":     checked("nsimages.go checkIPC"),
	"ipc_var_entry.mq_msgsize_default": checked("nsimages.go checkIPC"),
	"ipc_var_entry.msg_next_id":        free("the number of the namespace's next message queue"),
	"ipc_var_entry.sem_next_id":        free("the number of the namespace's next semaphore set"),
	"ipc_var_entry.shm_next_id":        free("the number of the namespace's next shared memory segment"),
	"timens_entry.monotonic":           checked("nsimages.go checkTimens"),
	"timens_entry.boottime":            checked("nsimages.go checkTimens"),
	"timespec":                         checked("nsimages.go checkTimens"),

	// ipcns-shm-, ipcns-msg-, ipcns-sem-<id>.img: objects of the pod's IPC
	// namespace (the image names it: nsimages.go checkIPC).
	"ipc_desc_entry.key":         free("the object's key in the pod's IPC namespace"),
	"ipc_desc_entry.id":          free("the object's number in the pod's IPC namespace"),
	"ipc_desc_entry.uid":         free("the object's owner in the pod's IPC namespace; an IPC object's owner grants access to that object alone"),
	"ipc_desc_entry.gid":         free("the object's group in the pod's IPC namespace; an IPC object's group grants access to that object alone"),
	"ipc_desc_entry.cuid":        free("the object's creator as dumped; the restore does not set it"),
	"ipc_desc_entry.cgid":        free("the object's creator as dumped; the restore does not set it"),
	"ipc_desc_entry.mode":        checked("fieldchecks.go checkIPCObjects: permission and status bits only (CRIU passes the mode to shmget, where 04000 is SHM_HUGETLB)"),
	"ipc_shm_entry.desc":         checked("fieldchecks.go checkIPCObjects"),
	"ipc_shm_entry.size":         free("the segment's size, which shmget bounds by the namespace's shmmax (checked) for root too"),
	"ipc_shm_entry.in_pagemaps":  free("whether the segment's pages are in a shmem pagemap image"),
	"ipc_shm_entry.hugetlb_flag": checked("fieldchecks.go checkIPCObjects: a huge-page segment needs CAP_IPC_LOCK or the node's vm.hugetlb_shm_group"),
	"ipc_msg_entry.desc":         checked("fieldchecks.go checkIPCObjects"),
	"ipc_msg_entry.qbytes":       free("the queue's size as dumped; the restore does not set it"),
	"ipc_msg_entry.qnum":         free("how many messages follow"),
	"ipc_msg.mtype":              free("a queued message's type"),
	"ipc_msg.msize":              free("a queued message's size, which msgsnd bounds by the namespace's msgmax (checked)"),
	"ipc_sem_entry.desc":         checked("fieldchecks.go checkIPCObjects"),
	"ipc_sem_entry.nsems":        free("the set's size, which semget bounds by the namespace's semmsl (checked) for root too"),

	// cgroup.img
	"cgroup_entry.sets":               checked(whyCgroup),
	"cgroup_entry.controllers":        checked(whyCgroup),
	"cg_set_entry.id":                 checked(whyCgroup),
	"cg_set_entry.ctls":               checked(whyCgroup),
	"cg_member_entry.name":            checked(whyCgroup),
	"cg_member_entry.path":            checked(whyCgroup),
	"cg_member_entry.cgns_prefix":     checked(whyCgroup),
	"cg_controller_entry.cnames":      checked(whyCgroup),
	"cg_controller_entry.dirs":        checked(whyCgroup),
	"cg_controller_entry.is_threaded": free("whether the hierarchy's directories below the container's are threaded, which the container's processes could make them"),
	"cgroup_dir_entry.dir_name":       checked(whyCgroup),
	"cgroup_dir_entry.children":       checked(whyCgroup),
	"cgroup_dir_entry.properties":     checked(whyCgroup),
	"cgroup_dir_entry.dir_perms":      checked(whyCgroup),
	"cgroup_prop_entry.name":          checked(whyCgroup),
	"cgroup_prop_entry.value":         checked(whyCgroup),
	"cgroup_prop_entry.perms":         checked(whyCgroup),
	"cgroup_perms.mode":               checked(whyCgroup),
	"cgroup_perms.uid":                checked(whyCgroup),
	"cgroup_perms.gid":                checked(whyCgroup),

	// memfd.img: the memfds' inodes
	"memfd_inode_entry.name":         free("the memfd's name (memfd_create)"),
	"memfd_inode_entry.uid":          free("the memfd's owner; its mode has no set-ID bits (fieldchecks.go checkMemfds), so an owner grants nothing"),
	"memfd_inode_entry.gid":          free("the memfd's group; its mode has no set-ID bits (fieldchecks.go checkMemfds), so a group grants nothing"),
	"memfd_inode_entry.mode":         checked("fieldchecks.go checkMemfds: no set-ID bits (CRIU sets owner and mode as root, criu/memfd.c; the memfd is executable through /proc/self/fd)"),
	"memfd_inode_entry.size":         free("the memfd's size; its pages are charged to the container's memory cgroup"),
	"memfd_inode_entry.shmid":        free("the shmem pagemap image of the memfd's pages"),
	"memfd_inode_entry.seals":        free("F_ADD_SEALS seals, which the process adds itself"),
	"memfd_inode_entry.inode_id":     free(whyID),
	"memfd_inode_entry.hugetlb_flag": free("MFD_HUGETLB, which memfd_create takes without a capability"),

	// pipes-data.img, fifo-data.img: the pipes' contents follow each entry
	"pipe_data_entry.pipe_id": free(whyID),
	"pipe_data_entry.bytes":   free("how many bytes of the pipe's contents follow"),
	"pipe_data_entry.size": checked("fieldchecks.go checkPipeData: at most the node's fs.pipe-max-size without CAP_SYS_RESOURCE " +
		"(CRIU sets it as root with F_SETPIPE_SZ, criu/pipes.c)"),

	// sk-queues.img: each queued packet's data follows its entry
	"sk_packet_entry.id_for": free("the socket of the tree the packet is queued on"),
	"sk_packet_entry.length": free("how many bytes of the packet follow"),
	"sk_packet_entry.scm":    free("descriptors of the tree's files.img the packet carries (SCM_RIGHTS)"),
	"scm_entry":              free("descriptors of the tree's files.img the packet carries (SCM_RIGHTS)"),

	// tcp-stream-<ino>.img: the connection's queues follow
	"tcp_stream_entry": free("a connected TCP socket's state, which CRIU reads only for a connected socket, " +
		"restored only with --tcp-established, which the runtime never passes (criu/sk-inet.c)"),
}

// imageClasses says, for every image file imageKinds admits (by an example
// name), the messages its entries are decoded into and walked with the
// field rules, or why it is not decoded. TestImageClasses holds it to
// imageKinds.
var imageClasses = []struct {
	example    string
	roots      []proto.Message
	notDecoded string
}{
	{example: "inventory.img", roots: []proto.Message{&inventory.InventoryEntry{}}},
	{example: "pstree.img", roots: []proto.Message{&pstree.PstreeEntry{}}},
	{example: "core-1.img", roots: []proto.Message{&criucore.CoreEntry{}}},
	{example: "ids-1.img", roots: []proto.Message{&criucore.TaskKobjIdsEntry{}}},
	{example: "seccomp.img", roots: []proto.Message{&seccomp.SeccompEntry{}}},
	{example: "netns-1.img", roots: []proto.Message{&netdev.NetnsEntry{}}},
	{example: "pidns-1.img", roots: []proto.Message{&pidns.PidnsEntry{}}},
	{example: "files.img", roots: []proto.Message{&fdinfo.FileEntry{}}},
	{example: "fdinfo-1.img", roots: []proto.Message{&fdinfo.FdinfoEntry{}}},
	{example: "mountpoints-1.img", roots: []proto.Message{&mnt.MntEntry{}}},
	// The data after the first entry is the deleted file's contents.
	{example: "ghost-file-1.img", roots: []proto.Message{&ghostfile.GhostFileEntry{}}},
	{example: "tmpfs-dev-1.tar.gz.img", notDecoded: "a gzipped tar of a tmpfs mount's files, checked entry by entry (contents.go checkTmpfs)"},
	{example: "mm-1.img", roots: []proto.Message{&mm.MmEntry{}}},
	{example: "pagemap-1.img", notDecoded: "where each run of pages goes in the task's memory: CRIU fills only the mappings of mm-*.img (checked) " +
		"and fails on a page outside them (criu/mem.c, restore_priv_vma_content); a page in a parent image needs a parent directory, which kindOf refuses"},
	{example: "pages-1.img", notDecoded: "the task's memory contents, the tenant's own"},
	{example: "fs-1.img", roots: []proto.Message{&fsimg.FsEntry{}}},
	{example: "remap-fpath.img", roots: []proto.Message{&remap.RemapFilePathEntry{}}},
	{example: "tty-info.img", roots: []proto.Message{&tty.TtyInfoEntry{}}},
	{example: "pipes-data.img", roots: []proto.Message{&pipedata.PipeDataEntry{}}},
	{example: "fifo-data.img", roots: []proto.Message{&pipedata.PipeDataEntry{}}},
	{example: "sk-queues.img", roots: []proto.Message{&skpacket.SkPacketEntry{}}},
	{example: "tty-data.img", roots: []proto.Message{&tty.TtyDataEntry{}}},
	{example: "utsns-1.img", roots: []proto.Message{&utsns.UtsnsEntry{}}},
	{example: "ipcns-var-1.img", roots: []proto.Message{&ipcvar.IpcVarEntry{}}},
	{example: "ipcns-shm-1.img", roots: []proto.Message{&ipcshm.IpcShmEntry{}}},
	{example: "ipcns-msg-1.img", roots: []proto.Message{&ipcmsg.IpcMsgEntry{}, &ipcmsg.IpcMsg{}}},
	{example: "ipcns-sem-1.img", roots: []proto.Message{&ipcsem.IpcSemEntry{}}},
	{example: "ipcns-shm-pages-1.img", notDecoded: "no CRIU image: CRIU writes and reads no such file (criu/image-desc.c)"},
	{example: "timens-1.img", roots: []proto.Message{&timens.TimensEntry{}}},
	{example: "tcp-stream-1.img", roots: []proto.Message{&tcpstream.TcpStreamEntry{}}},
	{example: "cgroup.img", roots: []proto.Message{&cgroup.CgroupEntry{}}},
	{example: "stats-dump.img", notDecoded: "CRIU's statistics; the restore writes stats-restore.img and reads neither (criu/stats.c)"},
	{example: "stats-restore.img", notDecoded: "CRIU's statistics; the restore writes stats-restore.img and reads neither (criu/stats.c)"},
	{example: "irmap-cache.img", notDecoded: "a cache only a dump reads (criu/irmap.c, irmap_load_cache from criu/cr-dump.c)"},
	{example: "memfd.img", roots: []proto.Message{&memfd.MemfdInodeEntry{}}},
	{example: "memfd-inode.img", roots: []proto.Message{&memfd.MemfdInodeEntry{}}},
	{example: "timerfd.img", roots: []proto.Message{&timerfd.TimerfdEntry{}}},
	{example: "rseq.img", notDecoded: "no CRIU image: a thread's rseq state is in its core image (thread_core_entry.rseq_entry)"},
	{example: "descriptors.json", notDecoded: "runc's JSON list of the container's stdio, checked by descriptors.go checkDescriptors"},
	{example: "dump.log", notDecoded: "CRIU's log, which the restore does not read"},
	{example: "restore.log", notDecoded: "CRIU's log, which the restore writes"},
}
