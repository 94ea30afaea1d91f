package ckptarchive

import (
	"github.com/cri-shim/cri-shim/internal/ckptarchive/ckptarchivetest"

	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	crmetadata "github.com/checkpoint-restore/checkpointctl/lib"
)

// streamFixture is a staging directory with an empty images directory and
// a streamer on it.
func streamFixture(t *testing.T) (stage, images, archive string, st *Stream) {
	t.Helper()
	stage = t.TempDir()
	images = filepath.Join(stage, crmetadata.CheckpointDirectory)
	if err := os.Mkdir(images, 0o700); err != nil {
		t.Fatal(err)
	}
	archive = filepath.Join(t.TempDir(), "c.tar")
	st, err := StartStream(archive, images)
	if err != nil {
		t.Fatal(err)
	}
	return stage, images, archive, st
}

// finishArchive ends the archive as packageOne does: the streamed entries,
// then the rest of the images directory.
func finishArchive(t *testing.T, stage string, st *Stream) (streamErr error) {
	t.Helper()
	f, streamed, err := st.Finish()
	if f == nil {
		t.Fatalf("finish: %v", err)
	}
	defer f.Close()
	bw := bufio.NewWriter(f)
	tw := tar.NewWriter(bw)
	if err := addTree(context.Background(), tw, stage, crmetadata.CheckpointDirectory, streamed); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	return err
}

// sameAsImages checks that the archive holds exactly the images directory.
func sameAsImages(t *testing.T, images string, content map[string][]byte) {
	t.Helper()
	want := map[string]bool{crmetadata.CheckpointDirectory + "/": true}
	err := filepath.WalkDir(images, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := crmetadata.CheckpointDirectory + "/" + d.Name()
		want[name] = true
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !bytes.Equal(content[name], b) {
			t.Errorf("%s: %d bytes in the archive, %d on disk, or other bytes", name, len(content[name]), len(b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range content {
		if !want[name] {
			t.Errorf("%s in the archive, not in the images", name)
		}
	}
	for name := range want {
		if _, ok := content[name]; !ok {
			t.Errorf("%s missing from the archive", name)
		}
	}
}

// writeSlowly writes b into images/name in chunks, as CRIU's page transfer
// does, and closes it.
func writeSlowly(t *testing.T, images, name string, b []byte, chunk int) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(images, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	for len(b) > 0 {
		n := min(chunk, len(b))
		if _, err := f.Write(b[:n]); err != nil {
			t.Fatal(err)
		}
		b = b[n:]
		time.Sleep(time.Millisecond)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// waitArchiveSize waits until the archive has at least n bytes.
func waitArchiveSize(t *testing.T, archive string, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		fi, err := os.Stat(archive)
		if err == nil && fi.Size() >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the archive did not reach %d bytes while the images were written", n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestStreamerCopiesPagesWhileTheyAreWritten(t *testing.T) {
	stage, images, archive, st := streamFixture(t)
	// Two tasks' pages, one after the other, an odd size each (the padding),
	// and small images that are not streamed.
	p1, p2 := randomBytes(3<<20+17, 1), randomBytes(1<<20+511, 2)
	if err := os.WriteFile(filepath.Join(images, "inventory.img"), []byte("inventory"), 0o600); err != nil {
		t.Fatal(err)
	}
	writeSlowly(t, images, "pages-1.img", p1, 64<<10)
	// The first image is in the archive before the capture ends: the copy
	// overlaps the capture.
	waitArchiveSize(t, archive, int64(2*tarBlock+len(p1)))
	if err := os.WriteFile(filepath.Join(images, "core-1.img"), []byte("core"), 0o600); err != nil {
		t.Fatal(err)
	}
	writeSlowly(t, images, "pages-2.img", p2, 100<<10)
	// pages-3 is still open when the capture ends: the end completes it.
	f3, err := os.Create(filepath.Join(images, "pages-3.img"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f3.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	// CRIU has ended once runc returns: every image is closed.
	if err := f3.Close(); err != nil {
		t.Fatal(err)
	}
	st.ImagesFinal()
	if err := finishArchive(t, stage, st); err != nil {
		t.Fatalf("streaming failed: %v", err)
	}
	names, content := ckptarchivetest.Read(t, archive)
	sameAsImages(t, images, content)
	want := []string{"checkpoint/", "checkpoint/pages-1.img", "checkpoint/pages-2.img", "checkpoint/pages-3.img"}
	for i, n := range want {
		if i >= len(names) || names[i] != n {
			t.Fatalf("archive begins %v, want the streamed entries %v first", names, want)
		}
	}
}

func TestStreamerFallsBackWhenAnImageChangesAfterItsClose(t *testing.T) {
	stage, images, archive, st := streamFixture(t)
	p1 := randomBytes(1<<20+100, 3)
	writeSlowly(t, images, "pages-1.img", p1, 256<<10)
	// The entry's padding is written once its header is: the entry is
	// closed. (A write before that is only more to copy.)
	waitArchiveSize(t, archive, int64(2*tarBlock+(len(p1)+tarBlock-1)/tarBlock*tarBlock))
	// Written again after CRIU closed it: what was streamed is stale.
	f, err := os.OpenFile(filepath.Join(images, "pages-1.img"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	st.ImagesFinal()
	if err := finishArchive(t, stage, st); err == nil {
		t.Fatal("an image changed after it was streamed, and the streamed copy was kept")
	}
	// Written whole from the images instead.
	_, content := ckptarchivetest.Read(t, archive)
	sameAsImages(t, images, content)
}

func TestStreamerAbandonEnds(t *testing.T) {
	_, images, _, st := streamFixture(t)
	f, err := os.Create(filepath.Join(images, "pages-1.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(randomBytes(1<<20, 4)); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { st.Abandon(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("abandon did not end a streamer tailing an open image")
	}
}

// bigFile is a FileInfo of any size, for headers no test could write.
type bigFile struct{ size int64 }

func (b bigFile) Name() string       { return "pages-1.img" }
func (b bigFile) Size() int64        { return b.size }
func (b bigFile) Mode() fs.FileMode  { return 0o600 }
func (b bigFile) ModTime() time.Time { return time.Unix(1700000000, 123456789) }
func (b bigFile) IsDir() bool        { return false }
func (b bigFile) Sys() any           { return nil }

func TestStreamedHeaderIsOneBlockForAnySize(t *testing.T) {
	for _, size := range []int64{0, 1, 8<<30 - 1, 8 << 30, 64 << 30} {
		b, err := headerBlock(bigFile{size}, "checkpoint/pages-1.img")
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if len(b) != tarBlock {
			t.Fatalf("size %d: header of %d bytes", size, len(b))
		}
		h, err := tar.NewReader(io.MultiReader(bytes.NewReader(b), bytes.NewReader(make([]byte, 2*tarBlock)))).Next()
		if err != nil {
			t.Fatalf("size %d: reading the header back: %v", size, err)
		}
		if h.Size != size || h.Name != "checkpoint/pages-1.img" {
			t.Fatalf("size %d: read back %q of %d bytes", size, h.Name, h.Size)
		}
	}
}
