package criucheck

import (
	"math/bits"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/creds"
)

// secbitKeepCaps is SECBIT_KEEP_CAPS, the one securebit a process sets
// without CAP_SETPCAP (prctl PR_SET_KEEPCAPS; include/uapi/linux/securebits.h).
const secbitKeepCaps = 1 << 4

// checkCreds compares a thread's credentials with the spec: every capability
// set within the spec's, the user and groups the spec's (or any, where the
// spec's processes may change them), securebits only with CAP_SETPCAP and
// no_new_privs kept where the spec sets it.
func (c *checker) checkCreds(image string, cr *creds.CredsEntry) error {
	p := c.p
	sets := []struct {
		field string
		words []uint32
		allow uint64
	}{
		{"cap_eff", cr.CapEff, p.effective},
		{"cap_prm", cr.CapPrm, p.permitted},
		{"cap_inh", cr.CapInh, p.inheritable},
		{"cap_bnd", cr.CapBnd, p.bounding},
		{"cap_amb", cr.CapAmb, p.ambient},
	}
	for _, s := range sets {
		got, err := bitsOf(s.words)
		if err != nil {
			return refuse(image, "thread_core.creds."+s.field, "%v", err)
		}
		if extra := got &^ s.allow; extra != 0 {
			return refuse(image, "thread_core.creds."+s.field, "has %s, not in the container's %s set", capName(uint(bits.TrailingZeros64(extra))), setName(s.field))
		}
	}
	ids := []struct {
		field string
		v     uint32
		want  uint32
		cap   string
	}{
		{"uid", cr.GetUid(), p.uid, "CAP_SETUID"},
		{"euid", cr.GetEuid(), p.uid, "CAP_SETUID"},
		{"suid", cr.GetSuid(), p.uid, "CAP_SETUID"},
		{"fsuid", cr.GetFsuid(), p.uid, "CAP_SETUID"},
		{"gid", cr.GetGid(), p.gid, "CAP_SETGID"},
		{"egid", cr.GetEgid(), p.gid, "CAP_SETGID"},
		{"sgid", cr.GetSgid(), p.gid, "CAP_SETGID"},
		{"fsgid", cr.GetFsgid(), p.gid, "CAP_SETGID"},
	}
	for _, id := range ids {
		if id.v != id.want && !c.mayChangeIDs(id.cap) {
			return refuse(image, "thread_core.creds."+id.field, "%d, the container runs as %d and may not change it", id.v, id.want)
		}
	}
	if !c.mayChangeIDs("CAP_SETGID") {
		for _, g := range cr.Groups {
			if !p.groups[g] {
				return refuse(image, "thread_core.creds.groups", "has %d, not one of the container's groups", g)
			}
		}
	}
	if sb := cr.GetSecbits(); sb&^secbitKeepCaps != 0 && !p.may("CAP_SETPCAP") {
		return refuse(image, "thread_core.creds.secbits", "%#x; setting securebits needs CAP_SETPCAP", sb)
	}
	if p.noNewPrivs && cr.GetNoNewPrivs() == 0 {
		return refuse(image, "thread_core.creds.no_new_privs", "not set, and the container's spec sets noNewPrivileges")
	}
	if l := c.specLSMLabel(); l != "" && cr.GetLsmProfile() == "" {
		// CRIU sets no label where the image has none: the restored
		// process would keep the label CRIU runs with, the runtime's, not
		// the container's (criu/lsm.c, render_lsm_profile).
		return refuse(image, "thread_core.creds.lsm_profile", "empty, and the container's spec confines it with %q", l)
	}
	if cr.GetLsmProfile() != "" || len(cr.GetApparmorData()) > 0 || cr.GetLsmSockcreate() != "" {
		// runc restore applies no LSM label of the image's: CRIU would
		// switch to the profile the image names (criu/lsm.c).
		if !c.lsmMatches(cr) {
			return refuse(image, "thread_core.creds.lsm_profile", "%q, not the container's", cr.GetLsmProfile())
		}
	}
	return nil
}

// mayChangeIDs: only a container that runs as root with the capability in
// its permitted set may have processes of other users or groups; a
// non-root container's processes keep the spec's (a setuid program caught
// mid-run is refused: its privilege came from a file the restore does not
// see).
func (c *checker) mayChangeIDs(capName string) bool {
	return c.p.uid == 0 && c.p.may(capName)
}

// specLSMLabel is the LSM label the spec confines the process with, "" for
// none (no AppArmor profile or "unconfined", no SELinux label).
func (c *checker) specLSMLabel() string {
	pr := c.p.spec.Process
	switch {
	case pr.SelinuxLabel != "":
		return pr.SelinuxLabel
	case pr.ApparmorProfile != "" && pr.ApparmorProfile != "unconfined":
		return pr.ApparmorProfile
	}
	return ""
}

// lsmMatches accepts an LSM label only when it is the spec's own.
func (c *checker) lsmMatches(cr *creds.CredsEntry) bool {
	if len(cr.GetApparmorData()) > 0 || cr.GetLsmSockcreate() != "" {
		return false
	}
	pr := c.p.spec.Process
	prof := cr.GetLsmProfile()
	if prof == "unconfined" {
		return pr.ApparmorProfile == "" || pr.ApparmorProfile == "unconfined"
	}
	return prof == pr.ApparmorProfile || prof == pr.ApparmorProfile+" (enforce)" || (pr.SelinuxLabel != "" && prof == pr.SelinuxLabel)
}

func setName(field string) string {
	switch field {
	case "cap_eff":
		return "effective"
	case "cap_prm":
		return "permitted"
	case "cap_inh":
		return "inheritable"
	case "cap_bnd":
		return "bounding"
	}
	return "ambient"
}
