package criucheck

import (
	"archive/tar"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// The users of the write rule's tests. The rootfs is made by the test's own
// user (me: root in CI, nobody in make unit-nonroot); the spec's user is
// another one (them), so the rootfs's files are another user's to it, and
// root's when the test runs as root.
func diffUsers() (me, myGID, them uint32) {
	me, myGID, them = uint32(os.Getuid()), uint32(os.Getgid()), 1000
	if me == them {
		them = 1001
	}
	return me, myGID, them
}

// writesSpec is a container of user uid (group gid) without capabilities
// but caps (ambient too, as a process other than root keeps only those
// across runc's exec), with the spec's usual mounts, a volume at /etc/app/conf, the
// service account's at /var/run/secrets/kubernetes.io/serviceaccount and
// cwd /work.
func writesSpec(uid, gid uint32, caps ...string) *specs.Spec {
	s := criutest.DefaultSpec()
	s.Process.User = specs.User{UID: uid, GID: gid}
	s.Process.NoNewPrivileges = true
	s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps, Inheritable: caps, Ambient: caps}
	s.Process.Cwd = "/work"
	s.Mounts = append(s.Mounts,
		specs.Mount{Destination: "/etc/app/conf", Type: "bind", Source: "/var/lib/kubelet/pods/x/volumes/conf", Options: []string{"rbind"}},
		specs.Mount{Destination: "/var/run/secrets/kubernetes.io/serviceaccount", Type: "bind", Source: "/var/lib/kubelet/pods/x/volumes/sa", Options: []string{"rbind", "ro"}})
	return s
}

// writesRootfs is a small rootfs, every file of the test's own user:
//
//	/ 0755, etc/ 0755 {passwd 0644, rw 0666}, tmp/ 01777 {theirs 0644},
//	pub/ 0777 {f 0644, sub/ 0755 {x 0644}, open/ 0777 {g 0644}, empty/ 0777},
//	ro/ 0555, mine/ 0755, private/ 0700 {open/ 0777 {y 0666}}, var/ 0755 {run -> ../run},
//	run/ 0777
//
// and, when the test runs as root, home/ 0755 of the spec's user them.
func writesRootfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	dirs := []struct {
		name string
		mode os.FileMode
	}{
		{".", 0o755}, {"etc", 0o755}, {"tmp", 0o777 | os.ModeSticky}, {"pub", 0o777}, {"pub/sub", 0o755}, {"pub/open", 0o777},
		{"pub/empty", 0o777}, {"ro", 0o555}, {"mine", 0o755}, {"private", 0o700}, {"private/open", 0o777}, {"var", 0o755}, {"run", 0o777},
	}
	files := []struct {
		name string
		mode os.FileMode
	}{
		{"etc/passwd", 0o644}, {"etc/rw", 0o666}, {"tmp/theirs", 0o644}, {"pub/f", 0o644}, {"pub/sub/x", 0o644}, {"pub/open/g", 0o644},
		{"private/open/y", 0o666},
	}
	for _, d := range dirs {
		p := filepath.Join(root, d.name)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		p := filepath.Join(root, f.name)
		if err := os.WriteFile(p, []byte("image's"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range dirs {
		if err := os.Chmod(filepath.Join(root, d.name), d.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../run", filepath.Join(root, "var", "run")); err != nil {
		t.Fatal(err)
	}
	if os.Getuid() == 0 {
		_, _, them := diffUsers()
		home := filepath.Join(root, "home")
		if err := os.Mkdir(home, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(home, int(them), int(them)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Each rule of where a diff may write, for a spec of another user without
// capabilities (or of the test's own user, where the case is about what a
// user may do to its own files): the entry is refused naming what, or
// accepted. A spec with CAP_DAC_OVERRIDE is allowed every one of them.
func TestRootfsDiffWrites(t *testing.T) {
	me, myGID, them := diffUsers()
	u, g := int(me), int(myGID)
	s := int(them)
	reg := func(name string, uid, gid int, mode int64) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, Uid: uid, Gid: gid, Mode: mode}
	}
	dir := func(name string, uid, gid int, mode int64) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeDir, Uid: uid, Gid: gid, Mode: mode}
	}
	link := func(name, target string, uid, gid int, mode int64) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target, Uid: uid, Gid: gid, Mode: mode}
	}
	wh := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeReg} }
	withXattr := func(h *tar.Header) *tar.Header {
		h.PAXRecords = map[string]string{"SCHILY.xattr.user.note": "x"}
		return h
	}
	withSize := func(h *tar.Header, n int64) *tar.Header { h.Size = n; return h }

	other := writesSpec(them, them)
	own := writesSpec(me, myGID)
	ownIn4242 := writesSpec(me, myGID)
	ownIn4242.Process.User.AdditionalGids = []uint32{4242}
	cases := []struct {
		name     string
		spec     *specs.Spec
		h        *tar.Header
		field    string // "" for accepted
		reason   string // a part of the refusal's reason
		needRoot bool
	}{
		{name: "overwrite of another user's (root's) 0644 file", spec: other, h: reg("etc/passwd", u, g, 0o644), field: "etc/passwd write",
			reason: fmt.Sprintf("uid %d cannot write /etc/passwd (mode 0644 owned by %d:%d); nor remove it: it cannot write /etc", them, me, myGID)},
		{name: "the same with CAP_CHOWN alone", spec: writesSpec(them, them, "CAP_CHOWN"), h: reg("etc/passwd", u, g, 0o644), field: "etc/passwd write"},
		{name: "a new file in another user's 0755 directory", spec: other, h: reg("etc/evil", s, s, 0o644), field: "etc/evil write",
			reason: fmt.Sprintf("uid %d cannot create /etc/evil: it cannot write /etc (mode 0755 owned by %d:%d)", them, me, myGID)},
		{name: "a new file in a directory the user owns", spec: own, h: reg("mine/new", u, g, 0o644)},
		{name: "a new file in a directory the user owns, of another user", spec: other, h: reg("home/new", s, s, 0o600), needRoot: true},
		{name: "a new file in the user's own read-only directory", spec: own, h: reg("ro/new", u, g, 0o644), field: "ro/new write"},
		{name: "a new file in a world-writable directory", spec: other, h: reg("pub/new", s, s, 0o644)},
		{name: "a new file in sticky /tmp", spec: other, h: reg("tmp/new", s, s, 0o644)},
		{name: "a new symlink in a world-writable directory", spec: other, h: &tar.Header{Name: "pub/s", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd", Uid: s, Gid: s}},
		{name: "another user's file in sticky /tmp replaced", spec: other, h: reg("tmp/theirs", s, s, 0o644), field: "tmp/theirs write", reason: "is sticky"},
		{name: "another user's file replaced by the user's in a world-writable directory", spec: other, h: reg("pub/f", s, s, 0o644)},
		{name: "that file replaced keeping its owner", spec: other, h: reg("pub/f", u, g, 0o644), field: "pub/f owner"},
		{name: "a new file of root", spec: other, h: reg("pub/rootfile", 0, s, 0o644), field: "pub/rootfile owner", reason: "owner 0 needs CAP_CHOWN"},
		{name: "a new file of another group", spec: other, h: reg("pub/grouped", s, 4242, 0o644), field: "pub/grouped owner"},
		{name: "another user's 0666 file written in place, owner and mode kept", spec: other, h: reg("etc/rw", u, g, 0o666)},
		{name: "that file given another mode", spec: other, h: reg("etc/rw", u, g, 0o644), field: "etc/rw write", reason: "chmod needs the owner"},
		{name: "that file given to the user", spec: other, h: reg("etc/rw", s, s, 0o666), field: "etc/rw write", reason: "chown needs CAP_CHOWN"},
		{name: "a parent directory entry equal to the directory", spec: other, h: dir("etc/", u, g, 0o755)},
		{name: "a parent directory entry of another mode", spec: other, h: dir("etc/", u, g, 0o777), field: "etc/ mode"},
		{name: "a parent directory entry of another owner", spec: other, h: dir("etc/", s, s, 0o755), field: "etc/ owner"},
		{name: "a parent directory entry of another group", spec: other, h: dir("etc/", u, s, 0o755), field: "etc/ owner", reason: "chgrp needs the owner"},
		{name: "the user's own directory given to another of its groups", spec: ownIn4242, h: dir("mine/", u, 4242, 0o755)},
		{name: "a parent directory entry setting an xattr", spec: other, h: withXattr(dir("etc/", u, g, 0o755)), field: "etc/ xattr"},
		{name: "the sticky bit cleared", spec: other, h: dir("tmp/", u, g, 0o777), field: "tmp/ mode"},
		{name: "the user's own directory given another mode", spec: own, h: dir("mine/", u, g, 0o700)},
		{name: "the user's own directory given away", spec: own, h: dir("mine/", s, s, 0o755), field: "mine/ owner"},
		{name: "a whiteout of another user's file in its 0755 directory", spec: other, h: wh("etc/.wh.passwd"), field: "etc/.wh.passwd whiteout",
			reason: fmt.Sprintf("uid %d cannot remove /etc/passwd: it cannot write /etc (mode 0755 owned by %d:%d)", them, me, myGID)},
		{name: "a whiteout in a world-writable directory", spec: other, h: wh("pub/.wh.f")},
		{name: "a whiteout of nothing", spec: other, h: wh("etc/.wh.nothing")},
		{name: "a whiteout in a directory the user cannot reach", spec: other, h: wh("private/open/.wh.y"), field: "private/open/.wh.y whiteout", reason: "cannot search /private"},
		{name: "a whiteout of another user's file in sticky /tmp", spec: other, h: wh("tmp/.wh.theirs"), field: "tmp/.wh.theirs whiteout"},
		{name: "a whiteout of a directory the user cannot empty", spec: other, h: wh("pub/.wh.sub"), field: "pub/.wh.sub whiteout", reason: "cannot write /pub/sub"},
		{name: "a whiteout of a directory the user can empty", spec: other, h: wh("pub/.wh.open")},
		{name: "an opaque whiteout of another user's directory", spec: other, h: wh("etc/.wh..wh..opq"), field: "etc/.wh..wh..opq whiteout"},
		{name: "an opaque whiteout of a world-writable directory", spec: other, h: wh("pub/open/.wh..wh..opq")},
		{name: "an opaque whiteout of an empty directory", spec: other, h: wh("pub/empty/.wh..wh..opq")},
		{name: "a directory replaced by a file, the user cannot empty it", spec: other, h: reg("pub/sub", s, s, 0o644), field: "pub/sub write"},
		{name: "a hard link to another user's 0644 file", spec: other, h: link("pub/l", "etc/passwd", u, g, 0o644), field: "pub/l link", reason: "protected_hardlinks"},
		{name: "a hard link to another user's 0666 file", spec: other, h: link("pub/l", "etc/rw", u, g, 0o666)},
		{name: "a hard link giving the 0666 file to the user", spec: other, h: link("pub/l", "etc/rw", s, s, 0o666), field: "pub/l owner"},
		{name: "an entry through a symbolic link", spec: other, h: reg("var/run/x", s, s, 0o644), field: "var/run/x path", reason: "/var/run is a symbolic link"},
		{name: "an entry in a missing directory", spec: other, h: reg("nope/x", s, s, 0o644), field: "nope/x path", reason: "/nope does not exist"},
		{name: "a world-writable directory in one the user cannot search", spec: other, h: reg("private/open/x", s, s, 0o644), field: "private/open/x write",
			reason: fmt.Sprintf("uid %d cannot search /private (mode 0700", them)},
		{name: "runc's mountpoint of a file volume", spec: other, h: reg("etc/hosts", 0, 0, 0o755)},
		{name: "runc's mountpoint's directory", spec: other, h: dir("etc/app/", 0, 0, 0o755)},
		{name: "runc's mountpoint's directory through /var/run -> /run", spec: other, h: dir("run/secrets/", 0, 0, 0o755)},
		{name: "runc's cwd", spec: other, h: dir("work/", 0, 0, 0o755)},
		{name: "a directory of root elsewhere", spec: other, h: dir("etc/other/", 0, 0, 0o755), field: "etc/other/ write"},
		{name: "runc's mountpoint with data", spec: other, h: withSize(reg("etc/hosts", 0, 0, 0o755), 5), field: "etc/hosts write"},
		{name: "runc's mountpoint with another mode", spec: other, h: dir("etc/app/", 0, 0, 0o777), field: "etc/app/ write"},
	}
	check := func(spec *specs.Spec, h *tar.Header) error {
		return newDiffWrites(writesRootfs(t), policyOf(spec)).entry(h)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needRoot && os.Getuid() != 0 {
				t.Skip("the rootfs needs a directory of the spec's user: run as root to chown it")
			}
			err := check(tc.spec, tc.h)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
			} else {
				var r *Refusal
				if !errors.As(err, &r) || r.Image != RootfsDiffImage || r.Field != tc.field || !strings.Contains(r.Reason, tc.reason) {
					t.Fatalf("%v, want a refusal of %s naming %q because %q", err, RootfsDiffImage, tc.field, tc.reason)
				}
			}
			// A user who gets past any file's owner and mode could have
			// written every one of them.
			if err := check(writesSpec(them, them, "CAP_DAC_OVERRIDE"), tc.h); err != nil {
				t.Fatalf("with CAP_DAC_OVERRIDE: %v", err)
			}
			// containerd's defaults in the permitted set of a user other
			// than root are gone after runc's exec: the rule holds.
			if tc.field != "" && tc.spec == other {
				s := writesSpec(them, them)
				s.Process.Capabilities = criutest.DefaultSpec().Process.Capabilities
				if err := check(s, tc.h); err == nil {
					t.Fatal("accepted for a user other than root with CAP_DAC_OVERRIDE only in the permitted set")
				}
			}
		})
	}
}

// ApplyFilter decides each header by Filter's rules first, then by where it
// lands; Filter alone knows no rootfs.
func TestRootfsDiffApplyFilter(t *testing.T) {
	_, _, them := diffUsers()
	root := writesRootfs(t)
	d, err := OpenRootfsDiff(writeDiff(t, layerTar(t)), writesSpec(them, them), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	filter := d.ApplyFilter(root)
	passwd := &tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Uid: int(them), Gid: int(them)}
	if ok, err := d.Filter(passwd); !ok || err != nil {
		t.Fatalf("Filter: %v %v", ok, err)
	}
	var r *Refusal
	if ok, err := filter(passwd); ok || !errors.As(err, &r) || r.Field != "etc/passwd write" {
		t.Fatalf("ApplyFilter: %v %v, want etc/passwd refused", ok, err)
	}
	if ok, err := filter(&tar.Header{Name: "pub/evil", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: int(them), Gid: int(them)}); ok || !errors.As(err, &r) || r.Field != "pub/evil mode" {
		t.Fatalf("ApplyFilter: %v %v, want the set-user-ID bit refused", ok, err)
	}
	if ok, err := filter(&tar.Header{Name: "pub/new", Typeflag: tar.TypeReg, Mode: 0o644, Uid: int(them), Gid: int(them)}); !ok || err != nil {
		t.Fatalf("ApplyFilter of a new file in a world-writable directory: %v %v", ok, err)
	}
}
