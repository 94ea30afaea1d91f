package e2e

import (
	"regexp"
	"slices"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/cgroup"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mnt"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// editCgroup applies edit to the checkpoint's cgroup.img.
func editCgroup(edit func(*cgroup.CgroupEntry)) func(testing.TB, ckptImages) {
	return func(t testing.TB, imgs ckptImages) {
		es, err := criutest.Decode(imgs["cgroup.img"], func() *cgroup.CgroupEntry { return new(cgroup.CgroupEntry) })
		if err != nil || len(es) != 1 {
			t.Fatalf("cgroup.img: %d entries, %v", len(es), err)
		}
		edit(es[0])
		if imgs["cgroup.img"], err = criutest.Encode("CGROUP", es[0]); err != nil {
			t.Fatal(err)
		}
	}
}

// editMounts replaces the checkpoint's mount namespace images' entries by
// what edit makes of them.
func editMounts(t testing.TB, imgs ckptImages, edit func([]*mnt.MntEntry) []*mnt.MntEntry) {
	for name, b := range imgs {
		if !regexp.MustCompile(`^mountpoints-[0-9]+\.img$`).MatchString(name) {
			continue
		}
		ms, err := criutest.Decode(b, func() *mnt.MntEntry { return new(mnt.MntEntry) })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if imgs[name], err = criutest.Encode("MNTS", criutest.Messages(edit(ms))...); err != nil {
			t.Fatal(err)
		}
	}
}

// dropMountpoint removes the mount at mp from the checkpoint's mount
// namespace images, as an attacker removing a read-only or masked path
// would.
func dropMountpoint(mp string) func(testing.TB, ckptImages) {
	return func(t testing.TB, imgs ckptImages) {
		var seen []string
		dropped := false
		editMounts(t, imgs, func(ms []*mnt.MntEntry) []*mnt.MntEntry {
			for _, m := range ms {
				seen = append(seen, m.GetMountpoint())
			}
			n := len(ms)
			ms = slices.DeleteFunc(ms, func(m *mnt.MntEntry) bool { return m.GetMountpoint() == mp || m.GetMountpoint() == "."+mp })
			dropped = dropped || len(ms) < n
			return ms
		})
		if !dropped {
			t.Fatalf("no mount at %s in the checkpoint; its mounts: %v", mp, seen)
		}
	}
}

// addBindMount adds to the checkpoint's mount tree the bind mount runc
// hands CRIU for a read-only volume at dest of host path source, as a
// checkpoint of a pod with that volume has it: an external mount keyed by
// its destination, below the root, like the spec's other binds
// (/etc/hostname's), read-only.
func addBindMount(t testing.TB, imgs ckptImages, dest, source string) {
	added := false
	editMounts(t, imgs, func(ms []*mnt.MntEntry) []*mnt.MntEntry {
		i := slices.IndexFunc(ms, func(m *mnt.MntEntry) bool { return m.GetExtKey() == "/etc/hostname" })
		if i < 0 {
			return ms
		}
		m := proto.Clone(ms[i]).(*mnt.MntEntry)
		top := uint32(0)
		for _, x := range ms {
			top = max(top, x.GetMntId())
		}
		m.MntId, m.Mountpoint, m.ExtKey, m.Root = proto.Uint32(top+1), proto.String(dest), proto.String(dest), proto.String(source)
		m.Flags = proto.Uint32(m.GetFlags() | unix.MS_RDONLY)
		added = true
		return append(ms, m)
	})
	if !added {
		t.Fatal("no /etc/hostname bind mount in the checkpoint to copy")
	}
}

// hostileTreeEdits are issue 41's edits of the cgroup and mount images:
// a cgroup property whose name climbs out of CRIU's cgroup yard to a node
// file (CRIU wrote it as root before the check knew property names), a
// controller name CRIU would mount as an option, and the spec's read-only
// and masked paths removed from the mount tree (a writable /proc/sys).
func hostileTreeEdits() []hostileEdit {
	return []hostileEdit{
		{"a cgroup property named outside the yard", editCgroup(func(e *cgroup.CgroupEntry) {
			d := e.Controllers[0].Dirs[0]
			d.Children = append(d.Children, &cgroup.CgroupDirEntry{DirName: proto.String("x"),
				Properties: []*cgroup.CgroupPropEntry{{Name: proto.String("../../../../../../../../../../tmp/cri-shim-e2e-owned"), Value: proto.String("owned")}}})
		}), "properties ../", 0, nil, false},
		{"a cgroup controller name that is a mount option", editCgroup(func(e *cgroup.CgroupEntry) {
			e.Controllers[0].Cnames = append(e.Controllers[0].Cnames, "release_agent=/tmp/cri-shim-e2e-agent")
		}), "cnames", 0, nil, false},
		{"/proc/sys left out of the mount tree", dropMountpoint("/proc/sys"), "mountpoint /proc/sys", 0, nil, false},
		{"a masked path left out of the mount tree", dropMountpoint("/proc/keys"), "mountpoint /proc/keys", 0, nil, false},
	}
}
