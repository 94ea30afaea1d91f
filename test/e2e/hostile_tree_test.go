package e2e

import (
	"regexp"
	"slices"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/cgroup"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mnt"
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

// dropMountpoint removes the mount at mp from the checkpoint's mount
// namespace images, as an attacker removing a read-only or masked path
// would.
func dropMountpoint(mp string) func(testing.TB, ckptImages) {
	return func(t testing.TB, imgs ckptImages) {
		dropped := false
		for name, b := range imgs {
			if !regexp.MustCompile(`^mountpoints-[0-9]+\.img$`).MatchString(name) {
				continue
			}
			ms, err := criutest.Decode(b, func() *mnt.MntEntry { return new(mnt.MntEntry) })
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			n := len(ms)
			ms = slices.DeleteFunc(ms, func(m *mnt.MntEntry) bool { return m.GetMountpoint() == mp || m.GetMountpoint() == "."+mp })
			dropped = dropped || len(ms) < n
			if imgs[name], err = criutest.Encode("MNTS", criutest.Messages(ms)...); err != nil {
				t.Fatal(err)
			}
		}
		if !dropped {
			t.Fatalf("no mount at %s in the checkpoint", mp)
		}
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
