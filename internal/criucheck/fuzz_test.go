package criucheck

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	remap "github.com/checkpoint-restore/go-criu/v8/crit/images/remap-file-path"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// maxCheckAlloc bounds what one Check may allocate in total, whatever the
// images hold: entries are read one at a time into a buffer of at most
// maxEntryBytes.
const maxCheckAlloc = 64 << 20

// FuzzCheck replaces one image of a checkpoint the spec allows with the
// fuzzer's bytes: Check must return (a refusal or nil), never panic or
// hang, and stay within its allocation bound.
func FuzzCheck(f *testing.F) {
	spec := criutest.DefaultSpec()
	withSeccomp(spec)
	base := f.TempDir()
	if err := criutest.ForSpec(spec).Write(base); err != nil {
		f.Fatal(err)
	}
	ents, err := os.ReadDir(base)
	if err != nil {
		f.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	for i, n := range names {
		b, err := os.ReadFile(filepath.Join(base, n))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		dir := t.TempDir()
		for _, n := range names {
			b, _ := os.ReadFile(filepath.Join(base, n))
			os.WriteFile(filepath.Join(dir, n), b, 0o600)
		}
		os.WriteFile(filepath.Join(dir, names[int(which)%len(names)]), data, 0o600)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_ = Check(dir, spec, Options{})
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; d > maxCheckAlloc {
			t.Fatalf("Check allocated %d bytes (bound %d)", d, maxCheckAlloc)
		}
	})
}

// FuzzCheckAccess puts the fuzzer's bytes in files.img or remap-fpath.img
// of a non-root container's checkpoint, over a small root file system with
// links: CheckAccess must return, never panic or loop, within the bound,
// whatever the paths (links, loops, /proc, socket names).
func FuzzCheckAccess(f *testing.F) {
	spec := criutest.DefaultSpec()
	spec.Process.User = specs.User{UID: 1000, GID: 1000}
	spec.Process.Capabilities = &specs.LinuxCapabilities{}
	rootfs := f.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "etc", "shadow"), nil, 0o600)
	os.Symlink("/etc/shadow", filepath.Join(rootfs, "link"))
	os.Symlink("loop", filepath.Join(rootfs, "loop"))
	files, err := criutest.Encode("FILES", regFile(5, "/link", 0), regFile(6, "/loop/x", 2))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(0), files)
	f.Add(uint8(1), []byte{})
	// Paths through links, /proc and a socket's name_dir; a ghost remap.
	paths, err := criutest.Encode("FILES", regFile(5, "/link/x", 0), regFile(6, "/proc/self/fd/3", 0x200000|0x20000),
		inotifyOn(7, "/loop"), unixSocket(8, "s.sock", "/link"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(0), paths)
	remaps, err := criutest.Encode("REMAP_FPATH", &remap.RemapFilePathEntry{OrigId: proto.Uint32(5), RemapId: proto.Uint32(9), RemapType: remap.RemapType_GHOST.Enum()})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(1), remaps)
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		dir := t.TempDir()
		if err := criutest.ForSpec(spec).Write(dir); err != nil {
			t.Fatal(err)
		}
		name := []string{"files.img", "remap-fpath.img"}[int(which)%2]
		os.WriteFile(filepath.Join(dir, name), data, 0o600)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_ = CheckAccess(dir, spec, rootfs)
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; d > maxCheckAlloc {
			t.Fatalf("CheckAccess allocated %d bytes (bound %d)", d, maxCheckAlloc)
		}
	})
}
