package ckptarchive

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	crmetadata "github.com/checkpoint-restore/checkpointctl/lib"
	"golang.org/x/sys/unix"
)

// The pages images of a capture, copied into the head of a container's
// archive in the kernel (stream.go says why and when).

// pagesArchive is an archive whose first members are the images directory's
// entry and its pages images, copied in the kernel; the rest is written
// behind them with archive/tar (packageOne).
type pagesArchive struct {
	f        *os.File            // the archive
	path     string              // the archive's path
	images   string              // the images directory, stage/checkpoint
	off      int64               // end of the entries written
	synced   int64               // writeback started up to here
	streamed map[string]entryEnd // name in images -> what was copied
}

// writeback starts writing the archive back up to end once writebackEvery
// more bytes are written; the final fsync waits for it. A failure is only a
// lost head start.
func (s *pagesArchive) writeback(end int64) {
	if end-s.synced >= writebackEvery {
		_ = unix.SyncFileRange(int(s.f.Fd()), s.synced, end-s.synced, unix.SYNC_FILE_RANGE_WRITE)
		s.synced = end
	}
}

// WriteComplete begins the archive at path as a Stream does, once the
// capture has ended and the pod runs again: the images directory's entry,
// then each pages image, whole, copied in the kernel with the archive's
// writeback started as it grows. It returns the archive positioned after
// them, with their names, as Finish does; on error it leaves no file.
func WriteComplete(path, images string) (*os.File, map[string]bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, nil, err
	}
	a := &pagesArchive{f: f, path: path, images: images, streamed: map[string]entryEnd{}}
	err = a.appendComplete()
	if err == nil {
		_, err = f.Seek(a.off, io.SeekStart)
	}
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, nil, err
	}
	return f, a.names(), nil
}

// begin writes the images directory's own entry first, as addTree would.
func (s *pagesArchive) begin() error {
	dir, err := os.Stat(s.images)
	if err != nil {
		return err
	}
	if err := s.writeHeader(0, dir, crmetadata.CheckpointDirectory+"/"); err != nil {
		return err
	}
	s.off = tarBlock
	return nil
}

func (s *pagesArchive) appendComplete() error {
	if err := s.begin(); err != nil {
		return err
	}
	ents, err := os.ReadDir(s.images)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || !isPagesImage(e.Name()) {
			continue
		}
		src, err := os.Open(filepath.Join(s.images, e.Name()))
		if err != nil {
			return err
		}
		err = s.appendWhole(src, e.Name())
		src.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// appendWhole adds the complete image src, named name, at the archive's end.
func (s *pagesArchive) appendWhole(src *os.File, name string) error {
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	for done := int64(0); done < fi.Size(); {
		n := min(fi.Size()-done, streamChunk)
		if err := copyRange(s.f, s.off+tarBlock+done, src, done, n); err != nil {
			return fmt.Errorf("copying %s: %w", name, err)
		}
		done += n
		s.writeback(s.off + tarBlock + done)
	}
	return s.closeEntry(s.off, fi, name)
}

// closeEntry writes the header of the entry at hdr, whose data is complete,
// and its padding, and moves the archive's end past it.
func (s *pagesArchive) closeEntry(hdr int64, fi os.FileInfo, name string) error {
	if err := s.writeHeader(hdr, fi, crmetadata.CheckpointDirectory+"/"+name); err != nil {
		return err
	}
	end := hdr + tarBlock + fi.Size()
	if pad := (tarBlock - end%tarBlock) % tarBlock; pad > 0 {
		if _, err := s.f.WriteAt(make([]byte, pad), end); err != nil {
			return err
		}
		end += pad
	}
	s.streamed[name] = entryEnd{size: fi.Size(), mtime: fi.ModTime()}
	s.off = end
	return nil
}

// names is the archive members already written, as addTree skips them.
func (s *pagesArchive) names() map[string]bool {
	names := make(map[string]bool, len(s.streamed)+1)
	names[crmetadata.CheckpointDirectory] = true // its header leads the archive
	for name := range s.streamed {
		names[crmetadata.CheckpointDirectory+"/"+name] = true
	}
	return names
}

// writeHeader writes the tar header block of fi, named name, at off.
func (s *pagesArchive) writeHeader(off int64, fi os.FileInfo, name string) error {
	b, err := headerBlock(fi, name)
	if err != nil {
		return err
	}
	_, err = s.f.WriteAt(b, off)
	return err
}

// headerBlock is the tar header of fi under name as one 512-byte block: the
// GNU format, which stores any size in the header itself, with times in
// whole seconds (the only ones it holds).
func headerBlock(fi os.FileInfo, name string) ([]byte, error) {
	h, err := tar.FileInfoHeader(fi, "")
	if err != nil {
		return nil, err
	}
	h.Name = name
	h.Format = tar.FormatGNU
	h.ModTime = h.ModTime.Truncate(time.Second)
	h.AccessTime, h.ChangeTime = time.Time{}, time.Time{}
	var b bytes.Buffer
	if err := tar.NewWriter(&b).WriteHeader(h); err != nil {
		return nil, err
	}
	if b.Len() != tarBlock {
		return nil, fmt.Errorf("tar header of %s takes %d bytes, not one block", name, b.Len())
	}
	return b.Bytes(), nil
}

// copyRange copies n bytes of src from srcOff into dst at dstOff, in the
// kernel where it can. Where both offsets are block-aligned, a file system
// with reflinks (XFS, btrfs) would share the blocks instead of copying them,
// first writing the source range back and locking both files, stalling
// CRIU's writes to it; such ranges are copied through user space.
func copyRange(dst *os.File, dstOff int64, src *os.File, srcOff, n int64) error {
	if dstOff%4096 == 0 && srcOff%4096 == 0 {
		return copyRangeUser(dst, dstOff, src, srcOff, n)
	}
	return kernelCopy(dst, dstOff, src, srcOff, n)
}

// kernelCopy copies n bytes of src from srcOff into dst at dstOff with
// copy_file_range, through user space where the kernel cannot.
func kernelCopy(dst *os.File, dstOff int64, src *os.File, srcOff, n int64) error {
	for n > 0 {
		k, err := unix.CopyFileRange(int(src.Fd()), &srcOff, int(dst.Fd()), &dstOff, int(min(n, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
				return copyRangeUser(dst, dstOff, src, srcOff, n)
			}
			return err
		}
		if k == 0 {
			return io.ErrUnexpectedEOF
		}
		n -= int64(k)
	}
	return nil
}

// copyRangeUser is copyRange through a user-space buffer.
func copyRangeUser(dst *os.File, dstOff int64, src *os.File, srcOff, n int64) error {
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	w, err := io.CopyBuffer(io.NewOffsetWriter(dst, dstOff), io.NewSectionReader(src, srcOff, n), *buf)
	if err == nil && w != n {
		err = io.ErrUnexpectedEOF
	}
	return err
}
