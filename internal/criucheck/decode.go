package criucheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/checkpoint-restore/go-criu/v8/magic"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The bounds of decoding. CRIU writes an image as a magic and then entries,
// each a little-endian uint32 length and a protobuf message of that length
// (criu/image.c; go-criu crit/decode.go reads the same layout). crit's own
// decoder allocates whatever length an entry claims, so a hostile 4 GiB length
// is a 4 GiB allocation: entries are read here, each bounded, into go-criu's
// generated types.
const (
	// maxEntryBytes bounds one entry. The largest legitimate ones are a
	// thread's core (registers and xsave state, a few KiB) and the seccomp
	// chain (at most 32768 BPF instructions of 8 bytes on one path,
	// kernel/seccomp.c MAX_INSNS_PER_PATH).
	maxEntryBytes = 1 << 20
	// maxImageBytes bounds one image file of entries (pages are not decoded).
	maxImageBytes = 64 << 20
	// maxEntries bounds the entries of one image.
	maxEntries = 1 << 16
)

var magics = magic.LoadMagic()

// openRegular opens dir/name without following a symlink and checks that
// it is a regular file.
func openRegular(dir, name string) (*os.File, int64, error) {
	fd, err := unix.Openat(unix.AT_FDCWD, dir+"/"+name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, &os.PathError{Op: "open", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%s is not a regular file", name)
	}
	return f, st.Size(), nil
}

// openEntries opens an image of entries with magic want, within the size
// bound, positioned at its first entry.
func openEntries(dir, name, want string) (*os.File, *entryReader, error) {
	f, size, err := openRegular(dir, name)
	if err != nil {
		return nil, nil, err
	}
	if size > maxImageBytes {
		f.Close()
		return nil, nil, fmt.Errorf("%s is %d bytes, more than the %d an image of entries may have", name, size, maxImageBytes)
	}
	if err := readMagic(f, name, want); err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, &entryReader{r: f, name: name}, nil
}

// readMagic reads an image's magic: the common or service magic, then the
// image's own (criu/include/magic.h), and checks it is want's.
func readMagic(r io.Reader, name, want string) error {
	var b [4]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return fmt.Errorf("%s: reading its magic: %w", name, err)
	}
	v := uint64(binary.LittleEndian.Uint32(b[:]))
	if v == magics.ByName["IMG_COMMON"] || v == magics.ByName["IMG_SERVICE"] {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return fmt.Errorf("%s: reading its magic: %w", name, err)
		}
		v = uint64(binary.LittleEndian.Uint32(b[:]))
	}
	if v != magics.ByName[want] {
		got, ok := magics.ByValue[v]
		if !ok {
			got = fmt.Sprintf("0x%x", v)
		}
		return fmt.Errorf("%s: magic %s, want %s", name, got, want)
	}
	return nil
}

// entryReader reads an image's entries one at a time into a reused buffer.
type entryReader struct {
	r    io.Reader
	name string
	buf  []byte
	n    int
}

// next unmarshals the next entry into m; io.EOF at a clean end.
func (e *entryReader) next(m proto.Message) error {
	var b [4]byte
	if _, err := io.ReadFull(e.r, b[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return io.EOF
		}
		return fmt.Errorf("%s: entry %d: %w", e.name, e.n, err)
	}
	size := binary.LittleEndian.Uint32(b[:])
	if size > maxEntryBytes {
		return fmt.Errorf("%s: entry %d claims %d bytes, more than the %d an entry may have", e.name, e.n, size, maxEntryBytes)
	}
	if e.n++; e.n > maxEntries {
		return fmt.Errorf("%s: more than %d entries", e.name, maxEntries)
	}
	if cap(e.buf) < int(size) {
		e.buf = make([]byte, size)
	}
	buf := e.buf[:size]
	if _, err := io.ReadFull(e.r, buf); err != nil {
		return fmt.Errorf("%s: entry %d: %w", e.name, e.n, io.ErrUnexpectedEOF)
	}
	if err := proto.Unmarshal(buf, m); err != nil {
		return fmt.Errorf("%s: entry %d: %w", e.name, e.n, err)
	}
	if err := fieldRules.walk(e.name, m.ProtoReflect()); err != nil {
		var r *Refusal
		if errors.As(err, &r) {
			return err
		}
		return fmt.Errorf("%s: entry %d: %w", e.name, e.n, err)
	}
	return nil
}

// walk refuses m, an entry of image, if it or a message in it has fields
// the generated types do not know (a newer CRIU's, or an attacker's), or a
// populated field whose rule (fields.go) is missing or refuses it.
func (rs fieldRuleSet) walk(image string, m protoreflect.Message) error {
	if len(m.GetUnknown()) > 0 {
		return fmt.Errorf("%s has fields this decoder does not know; CRIU might use them", m.Descriptor().Name())
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		r, ok := rs.rule(fd)
		switch {
		case !ok:
			err = refuse(image, string(fd.FullName()), "a field the checker has not classified")
		case r.class == classRefused:
			err = refuse(image, string(fd.FullName()), "a field cri-shim refuses: %s", r.why)
		case fd.Message() == nil || fd.IsMap():
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = rs.walk(image, l.Get(i).Message())
			}
		default:
			err = rs.walk(image, v.Message())
		}
		return err == nil
	})
	return err
}

// eachEntry decodes every entry of dir/name (magic want) into a fresh m from
// newMsg and calls fn with it.
func eachEntry[M proto.Message](dir, name, want string, newMsg func() M, fn func(M) error) error {
	f, er, err := openEntries(dir, name, want)
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		m := newMsg()
		if err := er.next(m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := fn(m); err != nil {
			return err
		}
	}
}

// oneEntry decodes the entry of dir/name, an image of one entry (CRIU
// reads only the first, criu/protobuf.c pb_read_one; a second would be seen
// by one reader and not the other), into m. A ghost file's entry is
// followed by the file's data (firstEntry).
func oneEntry(dir, name, want string, m proto.Message) error {
	return readFirst(dir, name, want, m, true)
}

// firstEntry decodes the first entry of dir/name into m; what follows is
// not read.
func firstEntry(dir, name, want string, m proto.Message) error {
	return readFirst(dir, name, want, m, false)
}

func readFirst(dir, name, want string, m proto.Message, only bool) error {
	f, er, err := openEntries(dir, name, want)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := er.next(m); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: no entry", name)
		}
		return err
	}
	if only {
		var b [1]byte
		if n, _ := f.Read(b[:]); n > 0 {
			return fmt.Errorf("%s: more than the one entry CRIU reads", name)
		}
	}
	return nil
}
