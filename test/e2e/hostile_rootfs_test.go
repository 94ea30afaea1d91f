package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// editDiff appends entries (add) to the rootfs-diff.tar of a container
// archive, as an attacker who can write the archive would; the diff's own
// entries and compression (gzip or none) are kept, and the rest of the
// archive too.
func editDiff(t testing.TB, archive string, add func(testing.TB, *tar.Writer)) {
	t.Helper()
	found := false
	rewriteArchive(t, archive, func(h *tar.Header, body []byte) ([]byte, bool) {
		if h.Name != "rootfs-diff.tar" {
			return body, true
		}
		found = true
		return appendToLayer(t, body, add), true
	}, nil)
	if !found {
		t.Fatalf("%s has no rootfs-diff.tar", archive)
	}
}

// appendToLayer is layer (a layer tar, gzip or plain) with add's entries
// after its own, compressed as it was.
func appendToLayer(t testing.TB, layer []byte, add func(testing.TB, *tar.Writer)) []byte {
	t.Helper()
	zipped := len(layer) >= 2 && layer[0] == 0x1f && layer[1] == 0x8b
	if zipped {
		zr, err := gzip.NewReader(bytes.NewReader(layer))
		if err != nil {
			t.Fatal(err)
		}
		if layer, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(t.TempDir(), "rootfs-diff.tar")
	if err := os.WriteFile(tmp, layer, 0o600); err != nil {
		t.Fatal(err)
	}
	rewriteArchive(t, tmp, func(_ *tar.Header, body []byte) ([]byte, bool) { return body, true }, func(tw *tar.Writer) { add(t, tw) })
	out, err := os.ReadFile(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if !zipped {
		return out
	}
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write(out)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// diffEntry writes h, and data for a regular file.
func diffEntry(t testing.TB, tw *tar.Writer, h *tar.Header, data []byte) {
	t.Helper()
	h.ModTime = time.Now()
	h.Size = int64(len(data))
	if err := tw.WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
}

// hostileDiffEdits are issue 41's hostile rootfs changes: what the runtime
// shim's applier would otherwise write as root into the restored
// container's rootfs. Each is refused by the rootfs diff check
// (internal/criucheck, CheckRootfsDiff) before any of it is applied, or, for
// what depends on where an entry lands, by the runtime shim while it applies
// the diff (RootfsDiff.ApplyFilter; atStart).
func hostileDiffEdits() []hostileEdit {
	return []hostileEdit{
		{name: "a set-user-ID root binary in the rootfs changes", field: "usr/local/bin/evil mode", uid: 0,
			diff: func(t testing.TB, tw *tar.Writer) {
				bin, err := os.ReadFile("/bin/true")
				if err != nil {
					t.Fatal(err)
				}
				diffEntry(t, tw, &tar.Header{Name: "usr/local/bin/evil", Typeflag: tar.TypeReg, Mode: 0o4755}, bin)
			}},
		{name: "a device node in the rootfs changes", field: "tmp/mem type", uid: 0,
			diff: func(t testing.TB, tw *tar.Writer) {
				diffEntry(t, tw, &tar.Header{Name: "tmp/mem", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 1}, nil)
			}},
		{name: "file capabilities in the rootfs changes", field: "usr/local/bin/capped xattr security.capability", uid: 0,
			diff: func(t testing.TB, tw *tar.Writer) {
				// vfs_cap_data revision 2, CAP_SYS_ADMIN (21) permitted
				// and effective.
				capability := string([]byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x00, 0x20, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
				diffEntry(t, tw, &tar.Header{Name: "usr/local/bin/capped", Typeflag: tar.TypeReg, Mode: 0o755,
					PAXRecords: map[string]string{"SCHILY.xattr.security.capability": capability}}, []byte("#!/bin/sh\n"))
			}},
		// The images made a process of user 1000 (the image check passes),
		// restored by a pod of user 1000 without CAP_CHOWN: a file of
		// another user is one it could not have made.
		{name: "a file of uid 4242 for a pod of user 1000", field: "tmp/foreign uid", uid: 1000, edit: asUser1000,
			diff: func(t testing.TB, tw *tar.Writer) {
				diffEntry(t, tw, &tar.Header{Name: "tmp/foreign", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 4242, Gid: 4242}, []byte("x"))
			}},
		// The same pod's diff replaces busybox's /etc/passwd (root's, 0644,
		// in root's 0755 /etc) with one giving root no password: a file of
		// root, which each header's rules allow, but one user 1000 could
		// neither write nor unlink.
		{name: "/etc/passwd replaced in a pod of user 1000", field: "etc/passwd write", uid: 1000, edit: asUser1000, atStart: true,
			diff: func(t testing.TB, tw *tar.Writer) {
				diffEntry(t, tw, &tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root::0:0:root:/root:/bin/sh\n"))
			}},
	}
}
