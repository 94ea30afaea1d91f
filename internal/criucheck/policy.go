package criucheck

import (
	"fmt"
	"strings"

	"github.com/moby/sys/capability"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// policy is what a container's spec allows its processes.
type policy struct {
	uid, gid uint32
	groups   map[uint32]bool // gid and the additional gids
	// caps by set, a bit per capability number.
	bounding, effective, permitted, inheritable, ambient uint64
	noNewPrivs                                           bool
	seccomp                                              *specs.LinuxSeccomp
	oomScoreAdj                                          *int
	spec                                                 *specs.Spec
}

// capBits maps OCI capability names (CAP_SYS_ADMIN) to their numbers.
var capBits = func() map[string]uint {
	m := map[string]uint{}
	for _, c := range capability.ListKnown() {
		m["CAP_"+strings.ToUpper(c.String())] = uint(c)
	}
	return m
}()

// capName names capability number n as the spec does.
func capName(n uint) string {
	for name, b := range capBits {
		if b == n {
			return name
		}
	}
	return fmt.Sprintf("capability %d", n)
}

func capSet(names []string) uint64 {
	var s uint64
	for _, n := range names {
		if b, ok := capBits[n]; ok && b < 64 {
			s |= 1 << b
		}
	}
	return s
}

func policyOf(spec *specs.Spec) *policy {
	pr := spec.Process
	p := &policy{
		uid:         pr.User.UID,
		gid:         pr.User.GID,
		groups:      map[uint32]bool{pr.User.GID: true},
		noNewPrivs:  pr.NoNewPrivileges,
		oomScoreAdj: pr.OOMScoreAdj,
		spec:        spec,
	}
	for _, g := range pr.User.AdditionalGids {
		p.groups[g] = true
	}
	if c := pr.Capabilities; c != nil {
		p.bounding = capSet(c.Bounding)
		p.effective = capSet(c.Effective)
		p.permitted = capSet(c.Permitted)
		p.inheritable = capSet(c.Inheritable)
		p.ambient = capSet(c.Ambient)
	}
	if spec.Linux != nil {
		p.seccomp = spec.Linux.Seccomp
	}
	return p
}

// may reports whether the spec's processes may hold capability c: the
// kernel lets a process gain a capability only within its bounding set, and
// runc starts it with the spec's permitted set (libcontainer/capabilities).
func (p *policy) may(c string) bool {
	b := capBits[c]
	return p.permitted&(1<<b) != 0
}

// holds reports whether the container's process keeps capability c once
// runc has started it: root keeps the spec's permitted set; a user other
// than root only its ambient set, since runc execs it as that user and
// execve clears the permitted set but for the ambient one
// (capabilities(7)), whatever the spec's permitted set says (containerd
// puts its defaults there for every user). The checks of what a process
// could have done to files (open, write, chown) use it.
func (p *policy) holds(c string) bool {
	held := p.permitted
	if p.uid != 0 {
		held = p.ambient
	}
	return held&(1<<capBits[c]) != 0
}

// passesFilePerms reports whether the container's process gets past any
// file's owner and mode: CAP_DAC_OVERRIDE passes the permission checks,
// CAP_FOWNER the owner's (chmod any file, then use it), CAP_SETUID becomes
// the owner. CAP_CHOWN alone is not counted, which is stricter than the
// kernel: such a process could chown a file to itself first.
func (p *policy) passesFilePerms() bool {
	return p.holds("CAP_DAC_OVERRIDE") || p.holds("CAP_FOWNER") || p.holds("CAP_SETUID")
}
