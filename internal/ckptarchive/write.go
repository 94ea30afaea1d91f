package ckptarchive

// The members of a container archive that follow its memory pages: the
// dumps, the log up to the cut, CRIU's log, the writable layer and the rest
// of CRIU's images, written once the pod runs again.

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	crmetadata "github.com/checkpoint-restore/checkpointctl/lib"
)

// Member is a small archive member written from memory.
type Member struct {
	Name string
	Data []byte
}

// Rest is what follows the pages in a container archive.
type Rest struct {
	// Dumps are config.dump, spec.dump and status.dump.
	Dumps []Member
	// Log is the container's log, of which the first LogSize bytes (its
	// length at the cut) are archived as container.log; nil for none.
	Log     *os.File
	LogSize int64
	// Stage is the capture's staging directory: work/dump.log,
	// rootfs-diff.tar and CRIU's images under checkpoint/.
	Stage string
	// Streamed are the images already in the archive (Stream.Finish,
	// WriteComplete).
	Streamed map[string]bool
	// ModTime is the members' time: the checkpoint's.
	ModTime time.Time
}

// WriteRest writes r's members into f, positioned after the pages, and
// ends the archive; the caller syncs and closes f.
func WriteRest(ctx context.Context, f *os.File, r Rest) error {
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	if err := writeRest(ctx, tw, r); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

func writeRest(ctx context.Context, tw *tar.Writer, r Rest) error {
	for _, m := range r.Dumps {
		if err := tw.WriteHeader(&tar.Header{Name: m.Name, Mode: 0o600, Size: int64(len(m.Data)), ModTime: r.ModTime, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(m.Data); err != nil {
			return err
		}
	}
	if r.Log != nil {
		if err := addPrefix(tw, r.Log, r.LogSize, "container.log", r.ModTime); err != nil {
			return fmt.Errorf("container log: %w", err)
		}
	}
	if err := addFile(tw, filepath.Join(r.Stage, "work", crmetadata.DumpLogFile), crmetadata.DumpLogFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := addFile(tw, filepath.Join(r.Stage, crmetadata.RootFsDiffTar), crmetadata.RootFsDiffTar); err != nil {
		return err
	}
	return addTree(ctx, tw, r.Stage, crmetadata.CheckpointDirectory, r.Streamed)
}

// addTree adds stage/dir (CRIU's images) to the archive under dir/, but for
// the names in skip (already in it: streamed). Only directories and regular
// files are taken.
func addTree(ctx context.Context, tw *tar.Writer, stage, dir string, skip map[string]bool) error {
	return filepath.WalkDir(filepath.Join(stage, dir), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rel, err := filepath.Rel(stage, p)
		if err != nil {
			return err
		}
		if skip[rel] {
			return nil
		}
		if d.IsDir() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			h, err := tar.FileInfoHeader(fi, "")
			if err != nil {
				return err
			}
			h.Name = rel + "/"
			return tw.WriteHeader(h)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("unexpected %s in CRIU's images: %s", d.Type(), rel)
		}
		return addFile(tw, p, rel)
	})
}

func addFile(tw *tar.Writer, src, name string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	h, err := tar.FileInfoHeader(fi, "")
	if err != nil {
		return err
	}
	h.Name = name
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	// Large chunks: the buffered writer below passes them straight to the
	// file, so memory pages are copied once on their way into the archive.
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	_, err = io.CopyBuffer(tw, io.LimitReader(f, h.Size), *buf)
	return err
}

// addPrefix adds the first size bytes of f to the archive under name.
func addPrefix(tw *tar.Writer, f *os.File, size int64, name string, modTime time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: size, ModTime: modTime, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	n, err := io.CopyBuffer(tw, io.NewSectionReader(f, 0, size), *buf)
	if err == nil && n != size {
		err = fmt.Errorf("%d of the %d bytes it had at the cut are left", n, size)
	}
	return err
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 4<<20); return &b }}
