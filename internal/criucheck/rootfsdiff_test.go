package criucheck

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cri-shim/cri-shim/internal/criucheck/criutest"
)

// diffSpec is a container of user 1000 (groups 1000 and 2000) without
// capabilities; root gives it CAP_CHOWN as uid 0.
func diffSpec(root bool) *specs.Spec {
	s := criutest.DefaultSpec()
	if root {
		s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: []string{"CAP_CHOWN"}, Permitted: []string{"CAP_CHOWN"}, Effective: []string{"CAP_CHOWN"}}
		return s
	}
	nonRoot(s)
	s.Process.Capabilities = &specs.LinuxCapabilities{}
	return s
}

// file is a regular file of the non-root spec's user.
func file(name, body string) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body)), Uid: 1000, Gid: 1000}
}

// layerTar is a layer tar of hdrs; a regular file's data is that many
// bytes of 'x'.
func layerTar(t testing.TB, hdrs ...*tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func writeDiff(t testing.TB, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), RootfsDiffImage)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// An ordinary diff of the non-root container: files, directories, symlinks
// (one out of the tree: the applier resolves it inside the rootfs), a hard
// link, whiteouts, a user.* xattr, owners its user and root, a sticky
// directory, the "./" root entry.
func ordinaryDiff() []*tar.Header {
	return []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
		{Name: "home/app/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 1000, Gid: 1000},
		file("home/app/data", "some state"),
		{Name: "home/app/shared", Typeflag: tar.TypeReg, Mode: 0o640, Size: 3, Uid: 1000, Gid: 2000},
		{Name: "home/app/tagged", Typeflag: tar.TypeReg, Mode: 0o600, Uid: 1000, Gid: 1000,
			PAXRecords: map[string]string{"SCHILY.xattr.user.origin": "checkpoint"}},
		{Name: "home/app/again", Typeflag: tar.TypeLink, Linkname: "home/app/data", Uid: 1000, Gid: 1000},
		{Name: "home/app/passwd", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd", Uid: 1000, Gid: 1000},
		{Name: "home/app/up", Typeflag: tar.TypeSymlink, Linkname: "../../../..", Uid: 1000, Gid: 1000},
		{Name: "etc/.wh.motd", Typeflag: tar.TypeReg},
		{Name: "var/cache/.wh..wh..opq", Typeflag: tar.TypeReg},
		{Name: "a/../home/app/clean", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 0, Gid: 0},
	}
}

// Each rule refuses its case, naming the entry and what is wrong; the
// ordinary diff is accepted, plain and gzip.
func TestCheckRootfsDiff(t *testing.T) {
	const max = 1 << 20
	cases := []struct {
		name  string
		root  bool // the root spec with CAP_CHOWN, else user 1000 without
		hdrs  []*tar.Header
		field string // "" for accepted
	}{
		{name: "ordinary", hdrs: ordinaryDiff()},
		{name: "ordinary, root with CAP_CHOWN", root: true, hdrs: ordinaryDiff()},
		{name: "char device", hdrs: []*tar.Header{{Name: "dev/mem", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 1}}, field: "dev/mem type"},
		{name: "block device", hdrs: []*tar.Header{{Name: "sda", Typeflag: tar.TypeBlock, Mode: 0o666, Devmajor: 8}}, field: "sda type"},
		{name: "FIFO", hdrs: []*tar.Header{{Name: "tmp/fifo", Typeflag: tar.TypeFifo, Mode: 0o666}}, field: "tmp/fifo type"},
		{name: "GNU sparse", hdrs: []*tar.Header{{Name: "big", Typeflag: tar.TypeGNUSparse, Mode: 0o644, Format: tar.FormatGNU}}, field: "big type"},
		{name: "unknown type", hdrs: []*tar.Header{{Name: "odd", Typeflag: 'X', Mode: 0o644}}, field: "odd type"},
		{name: "global PAX header", hdrs: []*tar.Header{{Name: "g", Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"comment": "x"}}}, field: "type"},
		{name: "setuid root binary", root: true, hdrs: []*tar.Header{{Name: "bin/sh2", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 8}}, field: "bin/sh2 mode"},
		{name: "setgid directory", hdrs: []*tar.Header{{Name: "srv/", Typeflag: tar.TypeDir, Mode: 0o2775, Uid: 1000, Gid: 1000}}, field: "srv/ mode"},
		{name: "setuid hard link", root: true, hdrs: []*tar.Header{{Name: "su2", Typeflag: tar.TypeLink, Linkname: "bin/su", Mode: 0o4755}}, field: "su2 mode"},
		{name: "file capabilities", root: true, hdrs: []*tar.Header{{Name: "bin/ping", Typeflag: tar.TypeReg, Mode: 0o755,
			PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}}}, field: "bin/ping xattr security.capability"},
		{name: "SELinux label", root: true, hdrs: []*tar.Header{{Name: "f", Typeflag: tar.TypeReg, PAXRecords: map[string]string{"SCHILY.xattr.security.selinux": "x"}}}, field: "f xattr security.selinux"},
		{name: "trusted xattr", root: true, hdrs: []*tar.Header{{Name: "f", Typeflag: tar.TypeReg, PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}}}, field: "f xattr trusted.overlay.opaque"},
		{name: "POSIX ACL", hdrs: []*tar.Header{{Name: "f", Typeflag: tar.TypeReg, PAXRecords: map[string]string{"SCHILY.xattr.system.posix_acl_access": "x"}}}, field: "f xattr system.posix_acl_access"},
		{name: "libarchive's xattr record", root: true, hdrs: []*tar.Header{{Name: "f", Typeflag: tar.TypeReg, PAXRecords: map[string]string{"LIBARCHIVE.xattr.security.capability": "AQAAAg=="}}}, field: "f xattr"},
		{name: "empty user xattr name", hdrs: []*tar.Header{{Name: "f", Typeflag: tar.TypeReg, PAXRecords: map[string]string{"SCHILY.xattr.user.": "x"}}}, field: "f xattr user."},
		{name: "another user's file", hdrs: []*tar.Header{{Name: "f", Typeflag: tar.TypeReg, Uid: 4242}}, field: "f uid"},
		{name: "another group's file", hdrs: []*tar.Header{{Name: "f", Typeflag: tar.TypeReg, Uid: 1000, Gid: 4242}}, field: "f gid"},
		{name: "another user's file, root with CAP_CHOWN", root: true, hdrs: []*tar.Header{{Name: "f", Typeflag: tar.TypeReg, Uid: 4242, Gid: 4242}}},
		{name: "uid -1", root: true, hdrs: []*tar.Header{{Name: "f", Typeflag: tar.TypeReg, Uid: -1}}, field: "f uid"},
		{name: "uid 2^32-1", root: true, hdrs: []*tar.Header{{Name: "f", Typeflag: tar.TypeReg, Uid: 1<<32 - 1}}, field: "f uid"},
		{name: "absolute name", hdrs: []*tar.Header{file("/etc/shadow", "")}, field: "/etc/shadow name"},
		{name: "name climbing out", hdrs: []*tar.Header{file("../../etc/shadow", "")}, field: "../../etc/shadow name"},
		{name: "name climbing out after cleaning", hdrs: []*tar.Header{file("a/../../etc/shadow", "")}, field: "a/../../etc/shadow name"},
		{name: "name longer than PATH_MAX", hdrs: []*tar.Header{file(strings.Repeat("d/", 2100)+"f", "")}, field: "name"},
		{name: "empty name", hdrs: []*tar.Header{{Typeflag: tar.TypeDir, Mode: 0o755}}, field: `"" name`},
		{name: "the root as a file", hdrs: []*tar.Header{file(".", "")}, field: ". name"},
		{name: "hard link out of the tree", hdrs: []*tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../etc/shadow", Uid: 1000, Gid: 1000}}, field: "h link"},
		{name: "hard link to an absolute name", hdrs: []*tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/shadow", Uid: 1000, Gid: 1000}}, field: "h link"},
		{name: "hard link to the root", hdrs: []*tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "./", Uid: 1000, Gid: 1000}}, field: "h link"},
		{name: "symlink target longer than PATH_MAX", hdrs: []*tar.Header{{Name: "s", Typeflag: tar.TypeSymlink, Linkname: strings.Repeat("x", 4097)}}, field: "s link"},
		{name: "empty symlink target", hdrs: []*tar.Header{{Name: "s", Typeflag: tar.TypeSymlink}}, field: "s link"},
		{name: "whiteout of the directory", hdrs: []*tar.Header{{Name: "etc/.wh..", Typeflag: tar.TypeReg}}, field: "etc/.wh.. whiteout"},
		{name: "whiteout of nothing", hdrs: []*tar.Header{{Name: "etc/.wh.", Typeflag: tar.TypeReg}}, field: "etc/.wh. whiteout"},
		{name: "reserved whiteout name", hdrs: []*tar.Header{{Name: "etc/.wh..wh.plnk", Typeflag: tar.TypeReg}}, field: "etc/.wh..wh.plnk whiteout"},
		{name: "whiteout with data", hdrs: []*tar.Header{{Name: "etc/.wh.motd", Typeflag: tar.TypeReg, Size: 4}}, field: "etc/.wh.motd whiteout"},
		{name: "whiteout as a directory", hdrs: []*tar.Header{{Name: "etc/.wh.motd", Typeflag: tar.TypeDir}}, field: "etc/.wh.motd whiteout"},
		{name: "file past the bound", hdrs: []*tar.Header{file("home/app/big", strings.Repeat("x", max))}, field: "home/app/big size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := layerTar(t, tc.hdrs...)
			for _, z := range []bool{false, true} {
				if z {
					b = gzipped(t, b)
				}
				err := CheckRootfsDiff(writeDiff(t, b), diffSpec(tc.root), max)
				if tc.field == "" {
					if err != nil {
						t.Fatalf("gzip %v: refused: %v", z, err)
					}
					continue
				}
				var r *Refusal
				if !errors.As(err, &r) || r.Image != RootfsDiffImage || !strings.Contains(r.Field, tc.field) {
					t.Fatalf("gzip %v: %v, want a refusal of %s naming %q", z, err, RootfsDiffImage, tc.field)
				}
				if !strings.Contains(err.Error(), "checkpoint refused") {
					t.Fatalf("error %q", err)
				}
			}
		})
	}
}

// PAX records tar.Writer does not write (GNU.sparse.*) are refused too: a
// sparse file of PAX format 0.1, and one of a version archive/tar does not
// read as sparse.
func TestRootfsDiffPAXSparse(t *testing.T) {
	for _, recs := range [][]string{
		{"GNU.sparse.major=0", "GNU.sparse.minor=1", "GNU.sparse.size=4096", "GNU.sparse.numblocks=1", "GNU.sparse.map=0,0"},
		{"GNU.sparse.major=2", "GNU.sparse.minor=0"},
	} {
		err := CheckRootfsDiff(writeDiff(t, withPAX(t, "big", recs...)), diffSpec(false), 1<<20)
		var r *Refusal
		if !errors.As(err, &r) || r.Field != "big type" || !strings.Contains(r.Reason, "sparse") {
			t.Fatalf("%v: %v, want a refusal of big as sparse", recs, err)
		}
	}
	if err := CheckRootfsDiff(writeDiff(t, withPAX(t, "big", "comment=not sparse")), diffSpec(false), 1<<20); err != nil {
		t.Fatalf("an ordinary PAX record: %v", err)
	}
}

// withPAX is a tar of the non-root user's empty file name after a PAX
// header of records (key=value) written as they are.
func withPAX(t testing.TB, name string, recs ...string) []byte {
	t.Helper()
	var data strings.Builder
	for _, r := range recs {
		n := len(r) + 2 // " " and "\n"
		d := len(strconv.Itoa(n))
		if len(strconv.Itoa(n+d)) > d {
			d++
		}
		fmt.Fprintf(&data, "%d %s\n", n+d, r)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "PaxHeaders/" + name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(data.Len()), Format: tar.FormatUSTAR})
	tw.Write([]byte(data.String()))
	h := file(name, "")
	h.Format = tar.FormatUSTAR
	if err := tw.WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	out := b.Bytes()
	// The first header becomes a PAX header: its type and checksum.
	out[156] = tar.TypeXHeader
	copy(out[148:156], "        ")
	sum := 0
	for _, c := range out[:512] {
		sum += int(c)
	}
	copy(out[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return out
}

// The name rule by itself: a NUL cannot come through archive/tar's reader
// (it refuses one in a PAX path), but archive.Apply's filter is given
// headers too.
func TestInsideName(t *testing.T) {
	for name, inside := range map[string]bool{
		"a/b": true, "./a": true, "a/": true, ".": true, "a/../b": true, "..a": true, "a/..b/c": true,
		"": false, "a\x00b": false, "/a": false, "..": false, "../a": false, "a/../../b": false, "a/./../..": false,
		strings.Repeat("a", 4097): false,
	} {
		if _, why := insideName(name); (why == "") != inside {
			t.Errorf("insideName(%.20q): %q, want inside %v", name, why, inside)
		}
	}
}

// A diff that expands past the bound is refused at the bound, whatever its
// headers claim: the tar stream is counted as it expands. Empty entries with
// long names (each a PAX header of its own) pass every header's size check;
// the stream does not.
func TestRootfsDiffBoundIsTheExpandedStream(t *testing.T) {
	const max = 2 << 20
	var hdrs []*tar.Header
	for i := 0; i < 1000; i++ {
		hdrs = append(hdrs, file(fmt.Sprintf("%04d-%s", i, strings.Repeat("n", 4000)), ""))
	}
	b := gzipped(t, layerTar(t, hdrs...))
	if len(b) > max/4 {
		t.Fatalf("the test's diff is %d bytes compressed: not a bomb", len(b))
	}
	err := CheckRootfsDiff(writeDiff(t, b), diffSpec(false), max)
	var r *Refusal
	if !errors.As(err, &r) || !strings.Contains(r.Reason, fmt.Sprintf("expands to more than %d bytes", max)) {
		t.Fatalf("%v, want refused at %d bytes", err, max)
	}
	if err := CheckRootfsDiff(writeDiff(t, b), diffSpec(false), 4*max); err != nil {
		t.Fatalf("within a larger bound: %v", err)
	}
}

// A gzip bomb (128 MiB of zeros in 130 KiB: gzip members of zeros one after
// the other, which a gzip reader reads as one stream) is refused at its
// header, before its data is expanded, and with bounded memory.
func TestRootfsDiffGzipBomb(t *testing.T) {
	const size = 128 << 20
	var hdr bytes.Buffer
	tw := tar.NewWriter(&hdr)
	tw.WriteHeader(file("first", ""))
	tw.WriteHeader(&tar.Header{Name: "bomb", Typeflag: tar.TypeReg, Mode: 0o644, Size: size, Uid: 1000, Gid: 1000})
	bomb := gzipped(t, hdr.Bytes())
	zeros := gzipped(t, make([]byte, 1<<20))
	for i := 0; i < size>>20; i++ {
		bomb = append(bomb, zeros...)
	}
	bomb = append(bomb, gzipped(t, make([]byte, 1024))...) // the tar's end
	if len(bomb) > size/512 {
		t.Fatalf("the bomb is %d bytes", len(bomb))
	}
	p := writeDiff(t, bomb)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := CheckRootfsDiff(p, diffSpec(false), 16<<20)
	runtime.ReadMemStats(&after)
	var r *Refusal
	if !errors.As(err, &r) || r.Field != "bomb size" {
		t.Fatalf("%v, want the bomb refused naming its size", err)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 8<<20 {
		t.Fatalf("the check allocated %d bytes", d)
	}
	if err := CheckRootfsDiff(p, diffSpec(false), 2*size); err != nil {
		t.Fatalf("the bomb within a bound above its size: %v", err)
	}
}

// The same rules decide each header when the diff is applied: Filter
// refuses what the check refuses, and counts the entries of one reading.
func TestRootfsDiffFilterIsTheCheck(t *testing.T) {
	p := writeDiff(t, layerTar(t, file("a", "")))
	d, err := OpenRootfsDiff(p, diffSpec(false), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if ok, err := d.Filter(file("a", "")); !ok || err != nil {
		t.Fatalf("an ordinary header: %v %v", ok, err)
	}
	if ok, err := d.Filter(&tar.Header{Name: "bin/sh2", Typeflag: tar.TypeReg, Mode: 0o4755}); ok || err == nil {
		t.Fatal("a set-user-ID header passed the filter")
	}
	d.entries = maxDiffEntries
	if ok, err := d.Filter(file("b", "")); ok || err == nil || !strings.Contains(err.Error(), "entries") {
		t.Fatalf("entry %d: %v %v", maxDiffEntries+1, ok, err)
	}
}

// Only a plain or gzip tar is read, and only a regular file.
func TestRootfsDiffFormats(t *testing.T) {
	zstd := []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0}
	var r *Refusal
	if err := CheckRootfsDiff(writeDiff(t, zstd), diffSpec(false), 1<<20); !errors.As(err, &r) || !strings.Contains(r.Reason, "zst") {
		t.Fatalf("zstd: %v", err)
	}
	if err := CheckRootfsDiff(writeDiff(t, []byte("not a tar at all, but long enough to be read as one......")), diffSpec(false), 1<<20); !errors.As(err, &r) {
		t.Fatalf("not a tar: %v", err)
	}
	if err := CheckRootfsDiff(writeDiff(t, nil), diffSpec(false), 1<<20); err != nil {
		t.Fatalf("an empty diff: %v", err)
	}
	p := writeDiff(t, layerTar(t, file("a", "")))
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(p, link)
	if err := CheckRootfsDiff(link, diffSpec(false), 1<<20); err == nil {
		t.Fatal("a symlink to the diff was read")
	}
	if err := CheckRootfsDiff(p, &specs.Spec{}, 1<<20); err == nil {
		t.Fatal("a spec without a process")
	}
	if err := CheckRootfsDiff(p, diffSpec(false), math.MaxInt64); err != nil {
		t.Fatalf("the largest bound: %v", err)
	}
}

// FuzzCheckRootfsDiff: whatever the diff's bytes, CheckRootfsDiff accepts
// or refuses (a *Refusal of a readable size), never panics, and stays
// within its allocation bound.
func FuzzCheckRootfsDiff(f *testing.F) {
	for _, hdrs := range [][]*tar.Header{
		ordinaryDiff(),
		{{Name: "bin/sh2", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 8}},
		{{Name: "dev/mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1}},
		{{Name: "f", Typeflag: tar.TypeReg, PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "x", "GNU.sparse.major": "1"}}},
		{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../x"}},
	} {
		b := layerTar(f, hdrs...)
		f.Add(b)
		f.Add(gzipped(f, b))
	}
	spec := diffSpec(false)
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), RootfsDiffImage)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := CheckRootfsDiff(p, spec, 1<<20)
		runtime.ReadMemStats(&after)
		var r *Refusal
		if err != nil && (!errors.As(err, &r) || len(r.Error()) > 2048) {
			t.Fatalf("not a readable refusal: %v", err)
		}
		if d := after.TotalAlloc - before.TotalAlloc; d > maxCheckAlloc {
			t.Fatalf("CheckRootfsDiff allocated %d bytes (bound %d)", d, maxCheckAlloc)
		}
	})
}
