package criucheck

import (
	"errors"
	"fmt"
	"io"
	"os"

	"google.golang.org/protobuf/proto"
)

// dataImage reads an image whose entries are each followed by raw data of a
// length the entry gives: the contents of pipes and FIFOs (pipes-data.img,
// fifo-data.img; criu/pipes.c), queued packets (sk-queues.img;
// criu/sk-queue.c), a TCP connection's queues (tcp-stream-*.img;
// criu/sk-tcp.c) and IPC objects (ipcns-*.img; criu/ipc_ns.c). Entries are
// decoded with the bounds of entryReader, the data skipped by seeking: the
// data is the processes' own and may be larger than an image of entries.
type dataImage struct {
	f    *os.File
	size int64
	er   *entryReader
}

func openDataImage(dir, name, want string) (*dataImage, error) {
	f, size, err := openRegular(dir, name)
	if err != nil {
		return nil, err
	}
	if err := readMagic(f, name, want); err != nil {
		f.Close()
		return nil, err
	}
	return &dataImage{f: f, size: size, er: &entryReader{r: f, name: name}}, nil
}

func (d *dataImage) Close() error { return d.f.Close() }

// next decodes the next entry into m; io.EOF at a clean end.
func (d *dataImage) next(m proto.Message) error { return d.er.next(m) }

// skip passes n bytes of data, which must be in the file.
func (d *dataImage) skip(n int64) error {
	pos, err := d.f.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	if n < 0 || n > d.size-pos {
		return fmt.Errorf("%s: entry %d: %d bytes of data, and the file has %d more", d.er.name, d.er.n, n, d.size-pos)
	}
	_, err = d.f.Seek(n, io.SeekCurrent)
	return err
}

// eachDataEntry decodes every entry of the data image dir/name (magic
// want) into a fresh m from newMsg, calls fn with it, and skips the number
// of bytes of data fn returns.
func eachDataEntry[M proto.Message](dir, name, want string, newMsg func() M, fn func(M, *dataImage) (int64, error)) error {
	d, err := openDataImage(dir, name, want)
	if err != nil {
		return err
	}
	defer d.Close()
	for {
		m := newMsg()
		if err := d.next(m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		n, err := fn(m, d)
		if err != nil {
			return err
		}
		if err := d.skip(n); err != nil {
			return err
		}
	}
}
