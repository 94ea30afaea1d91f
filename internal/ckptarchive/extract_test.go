package ckptarchive

import (
	"archive/tar"
	"os"
	"path/filepath"
	"testing"
)

// The archive is untrusted: entries the restore takes must be flat regular
// files, once each; everything else in it is never read.
func TestExtractRefusals(t *testing.T) {
	type entry struct {
		name string
		typ  byte
		body string
	}
	cases := map[string][]entry{
		"images subdirectory":  {{"checkpoint/sub/pages-1.img", tar.TypeReg, "x"}},
		"image symlink":        {{"checkpoint/pages-1.img", tar.TypeSymlink, ""}},
		"image twice":          {{"checkpoint/pages-1.img", tar.TypeReg, "a"}, {"checkpoint/pages-1.img", tar.TypeReg, "b"}},
		"climbing image name":  {{"checkpoint/../../pages-1.img", tar.TypeReg, "x"}},
		"diff a hard link":     {{"checkpoint/pages-1.img", tar.TypeReg, "x"}, {"rootfs-diff.tar", tar.TypeLink, ""}},
		"no images":            {{"config.dump", tar.TypeReg, "{}"}},
		"images a device node": {{"checkpoint/pages-1.img", tar.TypeChar, ""}},
	}
	for name, ents := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			archive := filepath.Join(dir, "a.tar")
			f, err := os.Create(archive)
			if err != nil {
				t.Fatal(err)
			}
			tw := tar.NewWriter(f)
			for _, e := range ents {
				h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o600, Size: int64(len(e.body))}
				if e.typ != tar.TypeReg {
					h.Size, h.Linkname = 0, "/etc/shadow"
				}
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
				tw.Write([]byte(e.body))
			}
			tw.Close()
			f.Close()
			out := filepath.Join(dir, "out")
			os.Mkdir(out, 0o700)
			if _, err := Extract(archive, out); err == nil {
				t.Fatal("extracted")
			}
			if _, err := os.Lstat(filepath.Join(dir, "pages-1.img")); err == nil {
				t.Fatal("an entry was written outside the staging directory")
			}
		})
	}
}
