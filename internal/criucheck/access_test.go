package criucheck

import (
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
	im := criutest.ForSpec(f.spec)
	im.Files = append(im.Files, files...)
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
		remap  uint32 // a file ID remap-fpath.img remaps
		refuse string // "" for accepted; else a part of the reason
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
		}, files: []*fdinfo.FileEntry{regFile(5, "/etc/token", unix.O_RDONLY)}, refuse: "mode 0400"},
		{name: "an absolute link to a root-only file", setup: func(t *testing.T, f *accessFixture) {
			if err := os.Symlink("/etc/shadow", filepath.Join(f.rootfs, "tmp", "s")); err != nil {
				t.Fatal(err)
			}
		}, files: []*fdinfo.FileEntry{regFile(5, "/tmp/s", unix.O_RDONLY)}, refuse: "mode 0600"},
		{name: "a link loop", setup: func(t *testing.T, f *accessFixture) {
			os.Symlink("b", filepath.Join(f.rootfs, "tmp", "a"))
			os.Symlink("a", filepath.Join(f.rootfs, "tmp", "b"))
		}, files: []*fdinfo.FileEntry{regFile(5, "/tmp/a", unix.O_RDONLY)}, refuse: "too many levels"},
		{name: "a missing file (CRIU's open fails)", files: []*fdinfo.FileEntry{regFile(5, "/etc/nothing", unix.O_RDONLY)}},
		{name: "a file on a mount that is not a bind", files: []*fdinfo.FileEntry{regFile(5, "/proc/kcore", unix.O_RDONLY)}},
		{name: "a remapped file (a ghost of the images)", files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_RDONLY)}, remap: 5},
		{name: "a path only for O_PATH", files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_PATH)}},
		{name: "CAP_DAC_READ_SEARCH reads", spec: func(s *specs.Spec) { s.Process.Capabilities.Permitted = []string{"CAP_DAC_READ_SEARCH"} },
			files: []*fdinfo.FileEntry{regFile(5, "/private/key", unix.O_RDONLY), regFile(6, "/etc/shadow", unix.O_RDONLY)}},
		{name: "CAP_DAC_READ_SEARCH does not write", spec: func(s *specs.Spec) { s.Process.Capabilities.Permitted = []string{"CAP_DAC_READ_SEARCH"} },
			files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_WRONLY)}, refuse: "for writing"},
		{name: "CAP_DAC_OVERRIDE opens anything", spec: func(s *specs.Spec) { s.Process.Capabilities.Permitted = []string{"CAP_DAC_OVERRIDE"} },
			files: []*fdinfo.FileEntry{regFile(5, "/etc/shadow", unix.O_RDWR)}},
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
					e := &remap.RemapFilePathEntry{OrigId: proto.Uint32(tc.remap), RemapId: proto.Uint32(99)}
					if err := criutest.WriteImage(filepath.Join(dir, "remap-fpath.img"), "REMAP_FPATH", e); err != nil {
						t.Fatal(err)
					}
				}
			}
			err := f.check(t, tc.files, extra)
			if tc.refuse == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want a refusal saying %q", tc.refuse)
			}
			r, ok := err.(*Refusal)
			if !ok || r.Image != "files.img" || !strings.HasSuffix(r.Field, "reg.name") || !strings.Contains(r.Reason, tc.refuse) {
				t.Fatalf("want a files.img reg.name refusal saying %q, got %v", tc.refuse, err)
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
