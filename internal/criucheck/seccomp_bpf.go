package criucheck

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"

	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
)

// A seccomp filter chain is checked by running it: for every system call of
// every architecture a process on this node can use, with argument values
// around those the profile's rules compare with, the chain's verdict (the
// kernel's: the filter result of highest precedence, kernel/seccomp.c
// seccomp_run_filters) must deny what the spec's profile denies. The BPF runs
// in golang.org/x/net/bpf's interpreter; syscall numbers come from
// go-seccomp-bpf's tables. Comparing programs by their bytes is not possible:
// libseccomp's output for one profile differs between versions.

// Seccomp return actions (include/uapi/linux/seccomp.h).
const (
	retKillProcess = 0x80000000
	retKillThread  = 0x00000000
	retTrap        = 0x00030000
	retErrno       = 0x00050000
	retUserNotif   = 0x7fc00000
	retTrace       = 0x7ff00000
	retLog         = 0x7ffc0000
	retAllow       = 0x7fff0000
	retActionFull  = 0xffff0000

	maxFilterInsns = 4096 // BPF_MAXINSNS
)

// filterFlagSpecAllow is SECCOMP_FILTER_FLAG_SPEC_ALLOW: the filter turns off
// the speculative store bypass mitigation; only the spec may ask for it.
const filterFlagSpecAllow = 1 << 2

// ociArches maps the spec's architectures to syscall tables.
var ociArches = map[specs.Arch]*arch.Info{
	specs.ArchX86_64:  arch.X86_64,
	specs.ArchX86:     arch.I386,
	specs.ArchX32:     arch.X32,
	specs.ArchAARCH64: arch.AARCH64,
	specs.ArchARM:     arch.ARM,
}

// nodeArches are the ABIs a process on this node can call the kernel with.
func nodeArches() []*arch.Info {
	switch runtime.GOARCH {
	case "amd64":
		return []*arch.Info{arch.X86_64, arch.I386, arch.X32}
	case "arm64":
		return []*arch.Info{arch.AARCH64, arch.ARM}
	}
	return nil
}

// program decodes one filter of the chain.
func program(b []byte) (*bpf.VM, error) {
	if len(b) == 0 || len(b)%8 != 0 || len(b)/8 > maxFilterInsns {
		return nil, fmt.Errorf("%d bytes is not a BPF program of at most %d instructions", len(b), maxFilterInsns)
	}
	raw := make([]bpf.RawInstruction, len(b)/8)
	for i := range raw {
		o := b[i*8:]
		raw[i] = bpf.RawInstruction{Op: binary.LittleEndian.Uint16(o), Jt: o[2], Jf: o[3], K: binary.LittleEndian.Uint32(o[4:])}
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		return nil, fmt.Errorf("an instruction the kernel's seccomp does not take")
	}
	for i, in := range insns {
		// seccomp loads only whole words of struct seccomp_data
		// (kernel/seccomp.c, seccomp_check_filter).
		if l, ok := in.(bpf.LoadAbsolute); ok && (l.Size != 4 || l.Off%4 != 0 || l.Off >= seccompDataLen) {
			return nil, fmt.Errorf("instruction %d loads %d bytes at offset %d of the syscall data", i, l.Size, l.Off)
		}
		switch in.(type) {
		case bpf.LoadAbsolute, bpf.LoadConstant, bpf.LoadScratch, bpf.StoreScratch, bpf.ALUOpConstant, bpf.ALUOpX,
			bpf.Jump, bpf.JumpIf, bpf.JumpIfX, bpf.RetA, bpf.RetConstant, bpf.TAX, bpf.TXA, bpf.NegateA:
		default:
			return nil, fmt.Errorf("instruction %d (%v) is not allowed in a seccomp filter", i, in)
		}
	}
	return bpf.NewVM(insns)
}

const seccompDataLen = 64 // struct seccomp_data: nr, arch, ip, args[6]

// seccompData builds the filter's input. The interpreter loads words big
// endian (network order); the kernel gives seccomp filters host-order
// words; each 32-bit word is therefore stored big endian at its offset.
func seccompData(nr, auditArch uint32, args *[6]uint64) []byte {
	b := make([]byte, seccompDataLen)
	binary.BigEndian.PutUint32(b[0:], nr)
	binary.BigEndian.PutUint32(b[4:], auditArch)
	for i, a := range args {
		off := 16 + 8*i
		binary.BigEndian.PutUint32(b[off:], uint32(a))       // low word first (little-endian host)
		binary.BigEndian.PutUint32(b[off+4:], uint32(a>>32)) // then the high word
	}
	return b
}

// verdict runs the chain: the action of highest precedence wins, compared as
// signed values of the action bits (kernel/seccomp.c, ACTION_ONLY).
func verdict(chain []*bpf.VM, data []byte) (uint32, error) {
	best := int32(retAllow)
	for _, vm := range chain {
		r, err := vm.Run(data)
		if err != nil {
			return 0, err
		}
		if a := int32(uint32(r) & retActionFull); a < best {
			best = a
		}
	}
	return uint32(best), nil
}

// lets reports whether an action lets the call run (a tracer or a
// supervisor could let it run too; neither is the profile's denial).
func lets(a uint32) bool {
	switch a {
	case retAllow, retLog, retTrace, retUserNotif:
		return true
	}
	return false
}

func ociAction(a specs.LinuxSeccompAction) uint32 {
	switch a {
	case specs.ActKill, specs.ActKillThread:
		return retKillThread
	case specs.ActKillProcess:
		return retKillProcess
	case specs.ActTrap:
		return retTrap
	case specs.ActErrno:
		return retErrno
	case specs.ActTrace:
		return retTrace
	case specs.ActLog:
		return retLog
	case specs.ActNotify:
		return retUserNotif
	}
	return retAllow
}

// specVerdict is the profile's action for a call (arg32: the ABI's
// arguments are 32 bits wide, as libseccomp compares them for i386, arm and
// x32, whose arch-x32.c is ARCH_SIZE_32); where several rules match,
// the most permissive counts, so that only what the profile surely denies
// is asked of the chain.
func specVerdict(prof *specs.LinuxSeccomp, name string, args *[6]uint64, arg32 bool) uint32 {
	out, matched := uint32(0), false
	for _, r := range prof.Syscalls {
		if !slices.Contains(r.Names, name) || !argsMatch(r.Args, args, arg32) {
			continue
		}
		a := ociAction(r.Action)
		if !matched || lets(a) {
			out, matched = a, true
		}
	}
	if !matched {
		return ociAction(prof.DefaultAction)
	}
	return out
}

func argsMatch(conds []specs.LinuxSeccompArg, args *[6]uint64, arg32 bool) bool {
	for _, c := range conds {
		if c.Index >= 6 {
			return false
		}
		v, x, y := args[c.Index], c.Value, c.ValueTwo
		if arg32 {
			v, x, y = uint64(uint32(v)), uint64(uint32(x)), uint64(uint32(y))
		}
		var ok bool
		switch c.Op {
		case specs.OpNotEqual:
			ok = v != x
		case specs.OpLessThan:
			ok = v < x
		case specs.OpLessEqual:
			ok = v <= x
		case specs.OpEqualTo:
			ok = v == x
		case specs.OpGreaterEqual:
			ok = v >= x
		case specs.OpGreaterThan:
			ok = v > x
		case specs.OpMaskedEqual:
			ok = v&x == y
		}
		if !ok {
			return false
		}
	}
	return true
}

// argSamples are the argument vectors tried for a call: all zero, all ones,
// and for each value a rule of the call compares with, that value and its
// neighbours in the compared argument.
func argSamples(prof *specs.LinuxSeccomp, name string) []*[6]uint64 {
	out := []*[6]uint64{{}, {^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}}
	for _, r := range prof.Syscalls {
		if !slices.Contains(r.Names, name) {
			continue
		}
		for _, c := range r.Args {
			if c.Index >= 6 {
				continue
			}
			for _, v := range []uint64{c.Value, c.Value - 1, c.Value + 1, c.ValueTwo, c.ValueTwo | ^c.Value, c.Value | c.ValueTwo} {
				if len(out) >= 64 {
					return out
				}
				a := new([6]uint64)
				a[c.Index] = v
				out = append(out, a)
			}
		}
	}
	return out
}

// seccompFilter is one filter of a chain as seccomp.img holds it.
type seccompFilter struct {
	index int
	code  []byte
	flags uint32
}

// checkChain refuses a chain that lets a process make a call the profile
// denies, or that asks for what only the spec may ask.
func checkChain(image string, filters []*seccompFilter, prof *specs.LinuxSeccomp) error {
	chain := make([]*bpf.VM, len(filters))
	for i, f := range filters {
		vm, err := program(f.code)
		if err != nil {
			return refuse(image, fmt.Sprintf("seccomp_filters[%d].filter", f.index), "%v", err)
		}
		chain[i] = vm
		if f.flags&filterFlagSpecAllow != 0 && !slices.Contains(prof.Flags, specs.LinuxSeccompFlagSpecAllow) {
			return refuse(image, fmt.Sprintf("seccomp_filters[%d].flags", f.index), "SECCOMP_FILTER_FLAG_SPEC_ALLOW, which the container's profile does not set")
		}
	}
	listed := map[*arch.Info]bool{}
	for _, a := range prof.Architectures {
		if info := ociArches[a]; info != nil {
			listed[info] = true
		}
	}
	for i, info := range nodeArches() {
		// libseccomp filters the native ABI and the listed ones; any
		// other ABI gets the bad-architecture action, a kill.
		inProfile := i == 0 || listed[info]
		nrs := make([]int, 0, len(info.SyscallNumbers)+3)
		top := 0
		for nr := range info.SyscallNumbers {
			nrs = append(nrs, nr)
			top = max(top, nr)
		}
		slices.Sort(nrs)
		nrs = append(nrs, top+1, top+100, 0xffff) // numbers no table names
		for _, nr := range nrs {
			name := info.SyscallNumbers[nr]
			callNr := uint32(nr)
			if info.SeccompMask != 0 {
				callNr |= uint32(info.SeccompMask)
			}
			for _, args := range argSamples(prof, name) {
				want := uint32(retKillThread)
				if inProfile {
					want = specVerdict(prof, name, args, info == arch.I386 || info == arch.ARM || info == arch.X32)
				}
				if lets(want) {
					continue
				}
				got, err := verdict(chain, seccompData(callNr, uint32(info.ID), args))
				if err != nil {
					return refuse(image, "seccomp_filters", "running the chain: %v", err)
				}
				if lets(got) {
					what := name
					if what == "" {
						what = fmt.Sprintf("number %d", nr)
					}
					return refuse(image, "seccomp_filters", "the chain lets %s call %s (arguments %v), which the container's seccomp profile denies", info.Name, what, *args)
				}
			}
		}
	}
	return nil
}
