package ckptarchive

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A container's memory pages, nearly all of a checkpoint's bytes, are copied
// into its archive in the kernel (copy_file_range), with the archive's
// writeback started as it grows. By default this happens once the pod runs
// again (WriteComplete). With [checkpoint] stream_archives it happens while
// CRIU still writes them (the Stream), so that the capture and the disk
// write overlap: the whole call is shorter, but the copy competes with the
// capture and the pod's freeze is longer (docs/checkpoint.md, "Writing the
// archives", has both measured).
//
// CRIU writes each task's pages to checkpoint/pages-<n>.img, opened once,
// appended to in order and closed once (criu/page-xfer.c), and these files
// are nearly all of a checkpoint's bytes. The Stream follows the images
// directory with inotify: it tails the oldest pages image not yet complete,
// copying each new range into the archive with copy_file_range, and moves on
// to the next when CRIU closes it (IN_CLOSE_WRITE) or the capture has ended.
// A tar header holds the entry's size, so each entry's 512-byte header block
// is reserved and written once the entry is complete; every streamed entry
// uses the GNU format, whose header is one block whatever the size. The
// archive's other members (small images, the writable layer, the dumps) are
// written after the resume (WriteRest), behind the streamed entries.
//
// Writeback of the archive is started as it grows (sync_file_range), so that
// little is left for the final fsync. Anything unexpected (a streamed image
// changed after it was closed, an inotify overflow, a copy error) ends the
// streaming: the archive is then written whole from the staging directory,
// so streaming can cost time but not a checkpoint.

const (
	tarBlock = 512
	// streamChunk bounds one copy, so that events are read between copies.
	streamChunk = 8 << 20
	// writebackEvery is how much archive is written between two starts of
	// its writeback.
	writebackEvery = 32 << 20
	// streamIdle is how long the Stream waits for CRIU when it has
	// nothing to copy.
	streamIdle = 5 * time.Millisecond
)

// isPagesImage reports whether name is one of CRIU's pages images.
func isPagesImage(name string) bool {
	return strings.HasPrefix(name, "pages-") && strings.HasSuffix(name, ".img") && !strings.Contains(name, "/")
}

// Stream copies CRIU's pages images into one archive during the capture.
type Stream struct {
	pagesArchive     // set by run, read after done
	ifd          int // inotify on images

	final chan struct{} // closed when the capture has ended: every image is complete
	stop  chan struct{} // closed to abandon the streaming
	done  chan struct{} // closed when run has returned
	err   error         // run's, read after done
}

// entryEnd is what the Stream copied of one image, checked again once the
// capture has ended.
type entryEnd struct {
	size  int64
	mtime time.Time
}

// StartStream creates the archive at path and starts following images (which
// must exist, and be empty: the watch is set before CRIU runs).
func StartStream(path, images string) (*Stream, error) {
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(ifd, images, unix.IN_CREATE|unix.IN_CLOSE_WRITE|unix.IN_ONLYDIR); err != nil {
		unix.Close(ifd)
		return nil, fmt.Errorf("watching %s: %w", images, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		unix.Close(ifd)
		return nil, err
	}
	s := &Stream{pagesArchive: pagesArchive{f: f, path: path, images: images, streamed: map[string]entryEnd{}},
		ifd: ifd, final: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer unix.Close(s.ifd)
		s.err = s.run()
	}()
	return s, nil
}

// ImagesFinal tells the Stream that CRIU has ended: whatever is in the
// images directory is complete.
func (s *Stream) ImagesFinal() { close(s.final) }

// Abandon stops the streaming and closes the archive (whose directory is
// being removed).
func (s *Stream) Abandon() {
	close(s.stop)
	<-s.done
	_ = s.f.Close()
}

// Finish waits for the streaming to end (ImagesFinal must have been called)
// and returns the archive positioned after the streamed entries, with their
// names. If the streaming failed, the archive is emptied, no names are
// returned, and err says why (the caller writes everything itself).
func (s *Stream) Finish() (f *os.File, streamed map[string]bool, err error) {
	<-s.done
	if err = s.err; err == nil {
		err = s.recheck()
	}
	if err != nil {
		// Begun again, whole: the same file emptied, or a new one.
		if terr := s.f.Truncate(0); terr == nil {
			if _, serr := s.f.Seek(0, io.SeekStart); serr == nil {
				return s.f, nil, err
			}
		}
		_ = s.f.Close()
		nf, oerr := os.OpenFile(s.path, os.O_WRONLY|os.O_TRUNC, 0o600)
		if oerr != nil {
			return nil, nil, errors.Join(err, oerr)
		}
		return nf, nil, err
	}
	if _, serr := s.f.Seek(s.off, io.SeekStart); serr != nil {
		_ = s.f.Close()
		return nil, nil, serr
	}
	return s.f, s.names(), nil
}

// recheck makes sure no streamed image changed after it was copied: same size
// and modification time now that CRIU has ended.
func (s *pagesArchive) recheck() error {
	for name, e := range s.streamed {
		fi, err := os.Lstat(filepath.Join(s.images, name))
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() || fi.Size() != e.size || !fi.ModTime().Equal(e.mtime) {
			return fmt.Errorf("%s changed after it was streamed (%d bytes then, %d now)", name, e.size, fi.Size())
		}
	}
	return nil
}

// tailed is the pages image being copied.
type tailed struct {
	name   string
	src    *os.File
	hdr    int64 // offset of its reserved header block
	copied int64
	closed bool // CRIU closed it (or the capture ended)
}

func (s *Stream) run() error {
	if err := s.begin(); err != nil {
		return err
	}
	var (
		queue  []string // pages images seen, in order of creation
		closed = map[string]bool{}
		cur    *tailed
		final  bool
		events = make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	)
	defer func() {
		if cur != nil {
			cur.src.Close()
		}
	}()
	for {
		if !final {
			select {
			case <-s.final:
				final = true
			default:
			}
		}
		select {
		case <-s.stop:
			return errors.New("abandoned")
		default:
		}
		// Read every pending event.
		for {
			n, err := unix.Read(s.ifd, events)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				break
			}
			if err != nil {
				return fmt.Errorf("inotify: %w", err)
			}
			if n <= 0 {
				break
			}
			for p := 0; p+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&events[p]))
				name := string(bytes.TrimRight(events[p+unix.SizeofInotifyEvent:p+unix.SizeofInotifyEvent+int(ev.Len)], "\x00"))
				p += unix.SizeofInotifyEvent + int(ev.Len)
				if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
					return errors.New("inotify queue overflow")
				}
				if !isPagesImage(name) {
					continue
				}
				if ev.Mask&unix.IN_CREATE != 0 {
					queue = append(queue, name)
				}
				if ev.Mask&unix.IN_CLOSE_WRITE != 0 {
					closed[name] = true
				}
			}
		}
		if cur == nil && len(queue) > 0 {
			src, err := os.Open(filepath.Join(s.images, queue[0]))
			if err != nil {
				return err
			}
			cur = &tailed{name: queue[0], src: src, hdr: s.off}
			queue = queue[1:]
		}
		if cur == nil {
			if final {
				return nil
			}
			s.wait()
			continue
		}
		cur.closed = cur.closed || closed[cur.name] || final
		fi, err := cur.src.Stat()
		if err != nil {
			return err
		}
		if fi.Size() < cur.copied {
			return fmt.Errorf("%s shrank while it was streamed", cur.name)
		}
		if avail := fi.Size() - cur.copied; avail > 0 {
			n := min(avail, streamChunk)
			if err := copyRange(s.f, s.off+tarBlock+cur.copied, cur.src, cur.copied, n); err != nil {
				return fmt.Errorf("copying %s: %w", cur.name, err)
			}
			cur.copied += n
			s.writeback(s.off + tarBlock + cur.copied)
			continue
		}
		if !cur.closed {
			s.wait()
			continue
		}
		// Complete: its header, its padding, then the next entry.
		fi, err = cur.src.Stat()
		if err != nil {
			return err
		}
		if fi.Size() != cur.copied {
			continue // written to after the last copy: copy the rest first
		}
		if err := s.closeEntry(cur.hdr, fi, cur.name); err != nil {
			return err
		}
		cur.src.Close()
		cur = nil
	}
}

// wait blocks until an inotify event, the end of the capture, or streamIdle.
func (s *Stream) wait() {
	fds := []unix.PollFd{{Fd: int32(s.ifd), Events: unix.POLLIN}}
	_, _ = unix.Poll(fds, int(streamIdle/time.Millisecond))
}
