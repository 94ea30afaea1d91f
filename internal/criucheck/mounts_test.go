package criucheck

import (
	"slices"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/mnt"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// imageMount is the image's mount at mountpoint mp (nil if none).
func imageMount(im *criutest.Images, mp string) *mnt.MntEntry {
	for _, m := range im.Mounts {
		if m.GetMountpoint() == mp {
			return m
		}
	}
	return nil
}

// dropMount removes the image's mount at mp.
func dropMount(mp string) func(*criutest.Images) {
	return func(im *criutest.Images) {
		im.Mounts = slices.DeleteFunc(im.Mounts, func(m *mnt.MntEntry) bool { return m.GetMountpoint() == mp })
	}
}

// The mount tree CRIU rebuilds must be the one runc makes for the spec:
// each mount of the spec, read-only and masked paths included, at its
// place with its flags and root; nothing else.
func TestCheckMountTree(t *testing.T) {
	cases := []checkCase{
		{name: "the mounts runc makes on cgroup v1"},
		{name: "the mounts runc makes on cgroup v2", spec: withCgroupNS},
		// The reported exploit: read-only and masked entries deleted.
		{name: "/proc/sys left out", edit: dropMount("/proc/sys"), field: "mountpoint /proc/sys"},
		{name: "a masked file left out", edit: dropMount("/proc/keys"), field: "mountpoint /proc/keys"},
		{name: "a masked path this kernel lacks, left out", spec: func(s *specs.Spec) {
			s.Linux.MaskedPaths = append(s.Linux.MaskedPaths, "/proc/no-such-file")
		}, edit: dropMount("/proc/no-such-file")},
		{name: "a bind mount of the spec left out", edit: dropMount("/etc/hosts"), field: "mountpoint /etc/hosts"},
		{name: "the spec's sysfs left out", edit: dropMount("/sys"), field: "mountpoint /sys"},
		{name: "/proc/sys read-write", edit: func(im *criutest.Images) { imageMount(im, "/proc/sys").Flags = proto.Uint32(0) }, field: "mountpoint /proc/sys flags"},
		{name: "/proc/sys rooted at proc's root", edit: func(im *criutest.Images) { imageMount(im, "/proc/sys").Root = proto.String("/") }, field: "mountpoint /proc/sys root"},
		{name: "/proc/sys of another file system", edit: func(im *criutest.Images) {
			imageMount(im, "/proc/sys").Fstype = proto.Uint32(uint32(mnt.Fstype_TMPFS))
		}, field: "mountpoint /proc/sys"},
		{name: "a proc mount rooted at a process's root", edit: func(im *criutest.Images) { imageMount(im, "/proc").Root = proto.String("/1/root") }, field: "mountpoint /proc root"},
		{name: "a masked directory as a read-write tmpfs", spec: func(s *specs.Spec) {
			s.Linux.MaskedPaths = append(s.Linux.MaskedPaths, "/proc/scsi")
		}, edit: func(im *criutest.Images) {
			m := imageMount(im, "/proc/scsi")
			m.ExtKey, m.Fstype, m.Flags = nil, proto.Uint32(uint32(mnt.Fstype_TMPFS)), proto.Uint32(0)
		}, field: "mountpoint /proc/scsi flags"},
		{name: "a masked directory as runc masks it", spec: func(s *specs.Spec) {
			s.Linux.MaskedPaths = append(s.Linux.MaskedPaths, "/proc/scsi")
		}, edit: func(im *criutest.Images) {
			m := imageMount(im, "/proc/scsi")
			m.ExtKey, m.Fstype = nil, proto.Uint32(uint32(mnt.Fstype_TMPFS))
		}},
		{name: "v1: a hierarchy mounted whole at the spec's cgroup mount", edit: func(im *criutest.Images) {
			m := imageMount(im, "/sys/fs/cgroup")
			m.Fstype = proto.Uint32(uint32(mnt.Fstype_CGROUP))
		}, field: "mountpoint /sys/fs/cgroup fstype"},
		{name: "v1: a controller mount rooted above the container", edit: func(im *criutest.Images) {
			imageMount(im, "/sys/fs/cgroup/memory").Root = proto.String("/kubepods")
		}, field: "mountpoint /sys/fs/cgroup/memory root"},
		{name: "v1: a controller mount read-write", edit: func(im *criutest.Images) {
			imageMount(im, "/sys/fs/cgroup/memory").Flags = proto.Uint32(0)
		}, field: "mountpoint /sys/fs/cgroup/memory flags"},
		{name: "v2: the hierarchy's root", spec: withCgroupNS, edit: func(im *criutest.Images) {
			imageMount(im, "/sys/fs/cgroup").Root = proto.String("/kubepods.slice")
		}, field: "mountpoint /sys/fs/cgroup root"},
		{name: "v2: rooted at the container's cgroup as the host shows it", spec: withCgroupNS, edit: func(im *criutest.Images) {
			imageMount(im, "/sys/fs/cgroup").Root = proto.String("/" + criutest.CgroupV2Dir)
		}},
		{name: "v2: read-write", spec: withCgroupNS, edit: func(im *criutest.Images) {
			imageMount(im, "/sys/fs/cgroup").Flags = proto.Uint32(0)
		}, field: "mountpoint /sys/fs/cgroup flags"},
		{name: "v2: a unified mount where runc makes none", spec: withCgroupNS, edit: func(im *criutest.Images) {
			im.Mounts = append(im.Mounts, criutest.Mount(99, 1, "/mnt", mnt.Fstype_CGROUP2, 1))
		}, field: "mountpoint /mnt fstype"},
		{name: "a proc mount where the spec has none", edit: func(im *criutest.Images) {
			im.Mounts = append(im.Mounts, criutest.Mount(99, 1, "/host-proc", mnt.Fstype_PROC, 0))
		}, field: "mountpoint /host-proc fstype"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { checkEdit(t, tc.spec, tc.edit, tc.field) })
	}
}
