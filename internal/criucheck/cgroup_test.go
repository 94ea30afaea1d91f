package criucheck

import (
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/cgroup"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// withCgroupNS is a spec of a cgroup v2 node: containerd's CRI gives the
// container a cgroup namespace there, and ForSpec then writes the v2 layout.
func withCgroupNS(s *specs.Spec) {
	s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.CgroupNamespace})
}

func cg(im *criutest.Images) *cgroup.CgroupEntry { return im.Cgroup }

// firstDir is the container's directory of the first hierarchy.
func firstDir(im *criutest.Images) *cgroup.CgroupDirEntry { return cg(im).Controllers[0].Dirs[0] }

func child(name string, props ...*cgroup.CgroupPropEntry) *cgroup.CgroupDirEntry {
	return &cgroup.CgroupDirEntry{DirName: proto.String(name), Properties: props,
		DirPerms: &cgroup.CgroupPerms{Mode: proto.Uint32(0o40755), Uid: proto.Uint32(0), Gid: proto.Uint32(0)}}
}

func prop(name, value string) *cgroup.CgroupPropEntry {
	return &cgroup.CgroupPropEntry{Name: proto.String(name), Value: proto.String(value)}
}

// The cgroup.img of an ordinary container is accepted in both layouts
// (co-mounted v1 controllers matched as CRIU's cgroup_contains matches
// them, v2 with its namespace prefix); each hostile edit is refused
// naming its field.
func TestCheckCgroup(t *testing.T) {
	cases := []checkCase{
		{name: "cgroup v1, co-mounted controllers"},
		{name: "cgroup v2 with a cgroup namespace", spec: withCgroupNS},
		{name: "co-mounted member named in another order", edit: func(im *criutest.Images) {
			cg(im).Sets[0].Ctls[0].Name = proto.String("cpuacct,cpu")
		}},
		{name: "a child cgroup the container made, with a property", edit: func(im *criutest.Images) {
			firstDir(im).Children = []*cgroup.CgroupDirEntry{child("worker", prop("cpu.shares", "512"))}
			cg(im).Sets[0].Ctls[0].Path = proto.String("/" + criutest.CgroupV1Dir + "/worker")
		}},
		{name: "a v2 child in the namespace", spec: withCgroupNS, edit: func(im *criutest.Images) {
			firstDir(im).Children = []*cgroup.CgroupDirEntry{child("init.scope", prop("memory.max", "1000000"))}
			cg(im).Sets[0].Ctls[0].Path = proto.String("/" + criutest.CgroupV2Dir + "/init.scope")
		}},
		// The reported exploit: a property name climbing out of the yard.
		{name: "a property name with ../", edit: func(im *criutest.Images) {
			firstDir(im).Children = []*cgroup.CgroupDirEntry{child("x", prop("../../../../../../tmp/owned", "pwned"))}
		}, field: "properties ../../../../../../tmp/owned"},
		{name: "a property name with a slash", edit: func(im *criutest.Images) {
			firstDir(im).Children = []*cgroup.CgroupDirEntry{child("x", prop("x/memory.limit_in_bytes", "1"))}
		}, field: "properties x/memory.limit_in_bytes"},
		{name: "a property of the container's own directory named outside", edit: func(im *criutest.Images) {
			firstDir(im).Properties = append(firstDir(im).Properties, prop("../release_agent", "/x"))
		}, field: "properties ../release_agent"},
		{name: "release_agent", edit: func(im *criutest.Images) {
			firstDir(im).Children = []*cgroup.CgroupDirEntry{child("x", prop("release_agent", "/x"))}
		}, field: "properties release_agent"},
		{name: "a child directory of several components", edit: func(im *criutest.Images) {
			firstDir(im).Children = []*cgroup.CgroupDirEntry{child("a/b")}
		}, field: "children dir_name"},
		{name: "a child directory ..", edit: func(im *criutest.Images) {
			firstDir(im).Children = []*cgroup.CgroupDirEntry{child("..")}
		}, field: "children dir_name"},
		{name: "a property value of a megabyte", edit: func(im *criutest.Images) {
			firstDir(im).Children = []*cgroup.CgroupDirEntry{child("x", prop("cpu.shares", strings.Repeat("1", 900<<10)))}
		}, field: "cpu.shares value"},
		{name: "a path longer than CRIU's buffers", edit: func(im *criutest.Images) {
			d := firstDir(im)
			for range 40 {
				c := child(strings.Repeat("d", 100))
				d.Children = []*cgroup.CgroupDirEntry{c}
				d = c
			}
		}, field: "deeper than"},
		{name: "a controller name that is a mount option", edit: func(im *criutest.Images) {
			cg(im).Controllers[1].Cnames = []string{"name=x,release_agent=/tmp/x"}
			cg(im).Sets[0].Ctls[1].Name = proto.String("name=x,release_agent=/tmp/x")
		}, field: "cnames"},
		{name: "a controller name that is a path", edit: func(im *criutest.Images) {
			cg(im).Controllers[1].Cnames = []string{"../../etc"}
		}, field: "cnames"},
		{name: "a controller in two entries", edit: func(im *criutest.Images) {
			cg(im).Controllers[2].Cnames = []string{"memory"}
		}, field: "cnames"},
		{name: "cgroup v2 co-mounted with a v1 controller", edit: func(im *criutest.Images) {
			cg(im).Controllers[4].Cnames = []string{"", "pids"}
		}, field: "cnames"},
		{name: "the hierarchy's root as the container's cgroup", edit: func(im *criutest.Images) {
			firstDir(im).DirName = proto.String("")
		}, field: "dir_name"},
		{name: "a member naming no hierarchy", edit: func(im *criutest.Images) {
			cg(im).Sets[0].Ctls[1].Name = proto.String("memory,blkio")
		}, field: "ctls memory,blkio name"},
		{name: "a member at the root of a hierarchy with no container cgroup", edit: func(im *criutest.Images) {
			cg(im).Controllers[2].Dirs = nil
			cg(im).Sets[0].Ctls[2].Path = proto.String("/")
		}, field: "sets[1].ctls pids path"},
		{name: "a member above the container's cgroup", edit: func(im *criutest.Images) {
			cg(im).Sets[0].Ctls[1].Path = proto.String("/kubepods")
		}, field: "sets[1].ctls memory path"},
		{name: "a member in a sibling cgroup sharing the prefix", edit: func(im *criutest.Images) {
			cg(im).Sets[0].Ctls[1].Path = proto.String("/" + criutest.CgroupV1Dir + "x")
		}, field: "sets[1].ctls memory path"},
		{name: "a namespace prefix where the container has no cgroup namespace", edit: func(im *criutest.Images) {
			cg(im).Sets[0].Ctls[1].CgnsPrefix = proto.Uint32(9)
		}, field: "cgns_prefix"},
		{name: "v2: a prefix past the path", spec: withCgroupNS, edit: func(im *criutest.Images) {
			cg(im).Sets[0].Ctls[0].CgnsPrefix = proto.Uint32(4000)
		}, field: "cgns_prefix"},
		{name: "v2: a prefix above the container's cgroup", spec: withCgroupNS, edit: func(im *criutest.Images) {
			cg(im).Sets[0].Ctls[0].CgnsPrefix = proto.Uint32(uint32(len("/kubepods.slice")))
		}, field: "cgns_prefix"},
		{name: "v2: no prefix", spec: withCgroupNS, edit: func(im *criutest.Images) {
			cg(im).Sets[0].Ctls[0].CgnsPrefix = nil
		}, field: "cgns_prefix"},
		{name: "v2: no cgroup.img", spec: withCgroupNS, edit: func(im *criutest.Images) { im.Cgroup = nil }, field: "cgroup.img"},
		{name: "v2: the task in CRIU's own cgroup namespace", spec: withCgroupNS, edit: func(im *criutest.Images) {
			im.Cores[1].Ids.CgroupNsId = proto.Uint32(criutest.HostNS)
		}, field: "ids.cgroup_ns_id"},
		{name: "v1: the task in a cgroup namespace the spec does not create", edit: func(im *criutest.Images) {
			im.Cores[1].Ids.CgroupNsId = proto.Uint32(77)
		}, field: "ids.cgroup_ns_id"},
		{name: "a child directory open to others", edit: func(im *criutest.Images) {
			c := child("x")
			c.DirPerms.Mode = proto.Uint32(0o40777)
			firstDir(im).Children = []*cgroup.CgroupDirEntry{c}
		}, field: "dir_perms"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { checkEdit(t, tc.spec, tc.edit, tc.field) })
	}
}

func TestRuncRestoresCgroupV2(t *testing.T) {
	for out, ok := range map[string]bool{
		"runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\n": false,
		"runc version 1.2.0\n":  true,
		"runc version 1.10.1\n": true,
		"runc version 2.0.0\n":  true,
		"runc version 0.9.9\n":  false,
		"crun version 1.8\n":    false,
		"":                      false,
	} {
		if err := RuncRestoresCgroupV2(out); (err == nil) != ok {
			t.Errorf("%q: %v, want accepted %v", out, err, ok)
		}
	}
}
