package criucheck

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	remap "github.com/checkpoint-restore/go-criu/v8/crit/images/remap-file-path"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// accessFixture is a container's root file system and one bind-mounted
// volume, owned by the test's user; the spec's user is another uid, so the
// owner's bits never apply to it.
type accessFixture struct {
	rootfs, volume string
	spec           *specs.Spec
}

func newAccessFixture(t *testing.T) *accessFixture {
	t.Helper()
	f := &accessFixture{rootfs: t.TempDir(), volume: t.TempDir(), spec: criutest.DefaultSpec()}
	uid, gid := uint32(os.Getuid()+1), uint32(os.Getgid()+1)
	f.spec.Process.User = specs.User{UID: uid, GID: gid}
	f.spec.Process.Capabilities = &specs.LinuxCapabilities{}
	f.spec.Mounts = append(f.spec.Mounts, specs.Mount{Destination: "/secret", Type: "bind", Source: f.volume, Options: []string{"rbind", "ro"}})
	for _, d := range []string{"etc", "private", "tmp", "run"} {
		f.mkdir(t, filepath.Join(f.rootfs, d), 0o755)
	}
	os.Chmod(filepath.Join(f.rootfs, "private"), 0o700)
	f.write(t, filepath.Join(f.rootfs, "etc", "hostname"), 0o644)
	f.write(t, filepath.Join(f.rootfs, "etc", "shadow"), 0o600)
	f.write(t, filepath.Join(f.rootfs, "tmp", "shared"), 0o666)
	f.write(t, filepath.Join(f.rootfs, "private", "key"), 0o644)
	f.write(t, filepath.Join(f.volume, "token"), 0o400)
	f.write(t, filepath.Join(f.volume, "ca.crt"), 0o644)
	return f
}

func (f *accessFixture) mkdir(t *testing.T, p string, mode os.FileMode) {
	if err := os.Mkdir(p, mode); err != nil {
		t.Fatal(err)
	}
}

func (f *accessFixture) write(t *testing.T, p string, mode os.FileMode) {
	if err := os.WriteFile(p, []byte("x"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func (f *accessFixture) check(t *testing.T, files []*fdinfo.FileEntry, extra func(dir string)) error {
	t.Helper()
	return f.checkImages(t, files, nil, extra)
}

func (f *accessFixture) checkImages(t *testing.T, files []*fdinfo.FileEntry, edit func(*criutest.Images), extra func(dir string)) error {
	t.Helper()
	im := criutest.ForSpec(f.spec)
	im.Files = append(im.Files, files...)
	if edit != nil {
		edit(im)
	}
	dir := t.TempDir()
	if err := im.Write(dir); err != nil {
		t.Fatal(err)
	}
	if extra != nil {
		extra(dir)
	}
	return CheckAccess(dir, f.spec, f.rootfs)
}

func TestCheckAccess(t *testing.T) {
	cases := []struct {
		name   string
		spec   func(*specs.Spec)
		setup  func(t *testing.T, f *accessFixture)
		files  []*fdinfo.FileEntry
		edit   func(*criutest.Images)
		remap  uint32 // a file ID remap-fpath.img remaps to a ghost
		refuse string // "" for accepted; else a part of the reason
		field  string // the refusal's field; reg.name when empty
	}{
		{name: "a file every user reads", files: []*fdinfo.FileEntry{regFile(5, "/etc/hostname", unix.O_RDONLY)}},
		{name: "a root-only file read", files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_RDONLY)}, refuse: "cannot open it for reading"},
		{name: "a file every user reads, opened for writing", files: []*fdinfo.FileEntry{regFile(5, "/etc/hostname", unix.O_RDWR)}, refuse: "for reading and writing"},
		{name: "a file every user writes", files: []*fdinfo.FileEntry{regFile(5, "/tmp/shared", unix.O_RDWR|unix.O_APPEND)}},
		{name: "a file in a directory the user cannot search", files: []*fdinfo.FileEntry{regFile(5, "/private/key", unix.O_RDONLY)}, refuse: "cannot search it"},
		{name: "a volume's readable file", files: []*fdinfo.FileEntry{regFile(5, "/secret/ca.crt", unix.O_RDONLY)}},
		{name: "a volume's owner-only file below a mountpoint not made yet", setup: func(t *testing.T, f *accessFixture) {
			f.spec.Mounts = append(f.spec.Mounts, specs.Mount{Destination: "/run/secrets/key", Type: "bind", Source: filepath.Join(f.volume, "token"), Options: []string{"rbind"}})
		}, files: []*fdinfo.FileEntry{regFile(5, "/run/secrets/key", unix.O_RDONLY)}, refuse: `"/run/secrets/key": mode 0400`},
		{name: "a volume's owner-only file", files: []*fdinfo.FileEntry{regFile(5, "/secret/token", unix.O_RDONLY)}, refuse: `"/secret/token": mode 0400`},
		{name: "a link in the rootfs into the volume", setup: func(t *testing.T, f *accessFixture) {
			if err := os.Symlink("../secret/token", filepath.Join(f.rootfs, "etc", "token")); err != nil {
				t.Fatal(err)
			}
		}, files: []*fdinfo.FileEntry{regFile(5, "/etc/token", unix.O_RDONLY)}, refuse: "/etc/token is a symbolic link"},
		{name: "a directory link in the rootfs into the volume", setup: func(t *testing.T, f *accessFixture) {
			if err := os.Symlink("../secret", filepath.Join(f.rootfs, "etc", "s")); err != nil {
				t.Fatal(err)
			}
		}, files: []*fdinfo.FileEntry{regFile(5, "/etc/s/ca.crt", unix.O_RDONLY)}, refuse: "component /etc/s is a symbolic link"},
		{name: "an absolute link to a root-only file", setup: func(t *testing.T, f *accessFixture) {
			if err := os.Symlink("/etc/shadow", filepath.Join(f.rootfs, "tmp", "s")); err != nil {
				t.Fatal(err)
			}
		}, files: []*fdinfo.FileEntry{regFile(5, "/tmp/s", unix.O_RDONLY)}, refuse: "/tmp/s is a symbolic link"},
		{name: "a link held open itself (O_PATH|O_NOFOLLOW)", setup: func(t *testing.T, f *accessFixture) {
			if err := os.Symlink("/etc/shadow", filepath.Join(f.rootfs, "tmp", "s")); err != nil {
				t.Fatal(err)
			}
		}, files: []*fdinfo.FileEntry{regFile(5, "/tmp/s", unix.O_PATH|unix.O_NOFOLLOW)}},
		{name: "a link loop a watch follows", setup: func(t *testing.T, f *accessFixture) {
			os.Symlink("b", filepath.Join(f.rootfs, "tmp", "a"))
			os.Symlink("a", filepath.Join(f.rootfs, "tmp", "b"))
		}, files: []*fdinfo.FileEntry{inotifyOn(5, "/tmp/a")}, refuse: "too many levels", field: "ify.wd.f_handle.path"},
		{name: "a watch on a root-only file", files: []*fdinfo.FileEntry{inotifyOn(5, "/etc/shadow")}, refuse: "for reading", field: "ify.wd.f_handle.path"},
		{name: "a watch on a link to a readable file", setup: func(t *testing.T, f *accessFixture) {
			os.Symlink("/etc/hostname", filepath.Join(f.rootfs, "tmp", "h"))
		}, files: []*fdinfo.FileEntry{inotifyOn(5, "/tmp/h")}},
		{name: "a file through runc's /dev/fd link", edit: devFdLink, files: []*fdinfo.FileEntry{regFile(5, "/dev/fd/7/etc/shadow", unix.O_RDONLY)},
			refuse: "component /dev/fd is a symbolic link"},
		{name: "a socket bound through runc's /dev/fd link", edit: devFdLink, files: []*fdinfo.FileEntry{unixSocket(5, "/dev/fd/7/run/x.sock", "")},
			refuse: "/proc/self/fd/7", field: "usk.name"},
		{name: "a socket bound through a rootfs link into /proc", setup: func(t *testing.T, f *accessFixture) {
			os.Symlink("/proc/1/root/run", filepath.Join(f.rootfs, "run", "host"))
		}, files: []*fdinfo.FileEntry{unixSocket(5, "/run/host/docker.sock", "")}, refuse: "/proc/1/root", field: "usk.name"},
		{name: "a socket bound through /var/run -> /run", setup: func(t *testing.T, f *accessFixture) {
			os.MkdirAll(filepath.Join(f.rootfs, "var"), 0o755)
			os.Symlink("../run", filepath.Join(f.rootfs, "var", "run"))
		}, files: []*fdinfo.FileEntry{unixSocket(5, "/var/run/app.sock", "")}},
		{name: "a volume mounted through /var/run -> /run, by its d_path", setup: func(t *testing.T, f *accessFixture) {
			os.MkdirAll(filepath.Join(f.rootfs, "var"), 0o755)
			os.Symlink("/run", filepath.Join(f.rootfs, "var", "run"))
			f.spec.Mounts = append(f.spec.Mounts, specs.Mount{Destination: "/var/run/secrets", Type: "bind", Source: f.volume, Options: []string{"rbind"}})
		}, files: []*fdinfo.FileEntry{regFile(5, "/run/secrets/token", unix.O_RDONLY)}, refuse: `"/run/secrets/token": mode 0400`},
		{name: "a cwd the user may only search", setup: func(t *testing.T, f *accessFixture) {
			f.mkdir(t, filepath.Join(f.rootfs, "srv"), 0o711)
			os.Chmod(filepath.Join(f.rootfs, "srv"), 0o711)
		}, edit: func(im *criutest.Images) { im.Files[1] = regFile(criutest.CwdFileID, "/srv", 0) }},
		{name: "a cwd the user may not search", edit: func(im *criutest.Images) { im.Files[1] = regFile(criutest.CwdFileID, "/private", 0) },
			refuse: "cannot open it for executing or searching"},
		{name: "a file the user may only search, opened for reading", setup: func(t *testing.T, f *accessFixture) {
			f.mkdir(t, filepath.Join(f.rootfs, "srv"), 0o711)
			os.Chmod(filepath.Join(f.rootfs, "srv"), 0o711)
		}, files: []*fdinfo.FileEntry{regFile(5, "/srv", unix.O_RDONLY)}, refuse: "for reading"},
		{name: "a missing file (CRIU's open fails)", files: []*fdinfo.FileEntry{regFile(5, "/etc/nothing", unix.O_RDONLY)}},
		{name: "a file on a mount that is not a bind", files: []*fdinfo.FileEntry{regFile(5, "/proc/kcore", unix.O_RDONLY)}},
		{name: "a remapped file (a ghost of the images)", files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_RDONLY)}, remap: 5},
		{name: "a path only for O_PATH", files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_PATH)}},
		{name: "CAP_DAC_READ_SEARCH reads", spec: held("CAP_DAC_READ_SEARCH"),
			files: []*fdinfo.FileEntry{regFile(5, "/private/key", unix.O_RDONLY), regFile(6, "/etc/shadow", unix.O_RDONLY)}},
		{name: "CAP_DAC_READ_SEARCH does not write", spec: held("CAP_DAC_READ_SEARCH"),
			files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_WRONLY)}, refuse: "for writing"},
		{name: "CAP_DAC_OVERRIDE opens anything", spec: held("CAP_DAC_OVERRIDE"),
			files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_RDWR)}},
		{name: "CAP_DAC_OVERRIDE in the permitted set alone of a user other than root", spec: func(s *specs.Spec) {
			s.Process.Capabilities.Permitted = []string{"CAP_DAC_OVERRIDE"}
		}, files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_RDWR)}, refuse: "cannot open it"},
		{name: "CAP_DAC_OVERRIDE opens nothing through a link", spec: held("CAP_DAC_OVERRIDE"),
			setup: func(t *testing.T, f *accessFixture) { os.Symlink("/etc", filepath.Join(f.rootfs, "tmp", "e")) },
			files: []*fdinfo.FileEntry{regFile(5, "/tmp/e/shadow", unix.O_RDWR)}, refuse: "component /tmp/e is a symbolic link"},
		{name: "the owner", spec: func(s *specs.Spec) { s.Process.User.UID = uint32(os.Getuid()) },
			files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_RDWR), regFile(6, "/secret/token", unix.O_RDONLY)}},
		{name: "the owner without the owner's write bit", spec: func(s *specs.Spec) { s.Process.User.UID = uint32(os.Getuid()) },
			files: []*fdinfo.FileEntry{regFile(5, "/secret/token", unix.O_WRONLY)}, refuse: "for writing"},
		{name: "the group, by an additional gid", spec: func(s *specs.Spec) { s.Process.User.AdditionalGids = []uint32{uint32(os.Getgid())} },
			setup: func(t *testing.T, f *accessFixture) { os.Chmod(filepath.Join(f.rootfs, "etc", "shadow"), 0o640) },
			files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_RDONLY)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newAccessFixture(t)
			if tc.spec != nil {
				tc.spec(f.spec)
			}
			if tc.setup != nil {
				tc.setup(t, f)
			}
			var extra func(string)
			if tc.remap != 0 {
				extra = func(dir string) {
					e := &remap.RemapFilePathEntry{OrigId: proto.Uint32(tc.remap), RemapId: proto.Uint32(99), RemapType: remap.RemapType_GHOST.Enum()}
					if err := criutest.WriteImage(filepath.Join(dir, "remap-fpath.img"), "REMAP_FPATH", e); err != nil {
						t.Fatal(err)
					}
				}
			}
			err := f.checkImages(t, tc.files, tc.edit, extra)
			if tc.refuse == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want a refusal saying %q", tc.refuse)
			}
			field := tc.field
			if field == "" {
				field = "reg.name"
			}
			r, ok := err.(*Refusal)
			if !ok || r.Image != "files.img" || !strings.HasSuffix(r.Field, field) || !strings.Contains(r.Reason, tc.refuse) {
				t.Fatalf("want a files.img %s refusal saying %q, got %v", field, tc.refuse, err)
			}
		})
	}
}

// The spec's user is root with the default capabilities: nothing is
// checked, not even a file no mode lets anyone read.
func TestCheckAccessRootWithDefaultCaps(t *testing.T) {
	f := newAccessFixture(t)
	f.spec = criutest.DefaultSpec()
	os.Chmod(filepath.Join(f.rootfs, "etc", "shadow"), 0)
	if err := f.check(t, []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_RDWR)}, nil); err != nil {
		t.Fatal(err)
	}
}

// devFdLink gives the checkpoint the /dev tmpfs image runc's /dev has: the
// link fd -> /proc/self/fd (the spec's /dev is mount 3 of criutest's tree).
func devFdLink(im *criutest.Images) {
	var b bytes.Buffer
	gz := gzip.NewWriter(&b)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "./fd", Typeflag: tar.TypeSymlink, Linkname: "/proc/self/fd", Mode: 0o777})
	tw.Close()
	gz.Close()
	im.Raw["tmpfs-dev-3.tar.gz.img"] = b.Bytes()
}

// held gives the spec's process capabilities it keeps as a user other than
// root: permitted and ambient (policy.holds).
func held(caps ...string) func(*specs.Spec) {
	return func(s *specs.Spec) {
		s.Process.Capabilities.Permitted = caps
		s.Process.Capabilities.Inheritable = caps
		s.Process.Capabilities.Ambient = caps
	}
}
