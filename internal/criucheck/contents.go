package criucheck

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"path"
	"regexp"
	"strconv"

	ghostfile "github.com/checkpoint-restore/go-criu/v8/crit/images/ghost-file"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mnt"
	"golang.org/x/sys/unix"
)

// Bounds of a tmpfs image: runc's /dev is a tmpfs of 64 MiB at most
// (containerd's default spec), a handful of entries.
const (
	maxTmpfsEntries = 10000
	maxTmpfsBytes   = 256 << 20
)

// runcDevices are the device nodes runc creates in every container
// (libcontainer/specconv AllowedDevices): null, zero, full, random,
// urandom, tty.
var runcDevices = [][2]int64{{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}}

// allowedDevice: a device node the container has, by type and numbers.
func (c *checker) allowedDevice(char bool, major, minor int64) bool {
	if char {
		for _, d := range runcDevices {
			if d[0] == major && d[1] == minor {
				return true
			}
		}
	}
	if c.p.spec.Linux == nil {
		return false
	}
	for _, d := range c.p.spec.Linux.Devices {
		if d.Major == major && d.Minor == minor && (d.Type == "c") == char && (d.Type == "b") == !char {
			return true
		}
	}
	return false
}

// checkGhosts reads the deleted files the restore recreates
// (ghost-file-*.img; criu/files-reg.c, create_ghost, as root): a device
// node would give the container a device, a set-user-ID file a privilege
// (it stays open, and executable through /proc/self/fd).
func (c *checker) checkGhosts() error {
	for _, name := range c.files["ghost"] {
		var g ghostfile.GhostFileEntry
		if err := firstEntry(c.dir, name, "GHOST_FILE", &g); err != nil {
			return asRefusal(name, err)
		}
		mode := g.GetMode()
		switch mode & unix.S_IFMT {
		case unix.S_IFREG, unix.S_IFDIR:
		case unix.S_IFCHR, unix.S_IFBLK:
			return refuse(name, "mode", "a device node %d:%d: the restore would mknod it as root", unix.Major(uint64(g.GetRdev())), unix.Minor(uint64(g.GetRdev())))
		default:
			return refuse(name, "mode", "%#o is not a regular file or a directory", mode)
		}
		if mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			return refuse(name, "mode", "%#o is set-user-ID or set-group-ID", mode)
		}
	}
	return nil
}

// checkTmpfs reads the contents of the tmpfs mounts the restore refills
// (tmpfs-dev-*.tar.gz.img, extracted by tar as root; criu/filesystems.c,
// tmpfs_restore): only files, directories, links and FIFOs inside the
// mount, device nodes the container has, nothing set-user-ID.
func (c *checker) checkTmpfs() error {
	for _, name := range c.files["tmpfs"] {
		if err := c.checkTmpfsImage(name); err != nil {
			return asRefusal(name, err)
		}
	}
	return nil
}

func (c *checker) checkTmpfsImage(name string) error {
	links := map[string]bool{} // symlinks extracted so far
	return eachTmpfsEntry(c.dir, name, func(h *tar.Header) error {
		field := "entry " + h.Name
		if why := checkPath(h.Name); why != "" || len(h.Name) > 0 && h.Name[0] == '/' {
			return refuse(name, field, "a name outside the mount")
		}
		clean := path.Clean(h.Name)
		for d := path.Dir(clean); d != "." && d != "/"; d = path.Dir(d) {
			if links[d] {
				return refuse(name, field, "below the symlink %s: tar would write through it", d)
			}
		}
		switch h.Typeflag {
		case tar.TypeSymlink:
			links[clean] = true
		case tar.TypeReg, tar.TypeDir, tar.TypeFifo:
		case tar.TypeLink:
			if why := checkPath(h.Linkname); why != "" || len(h.Linkname) > 0 && h.Linkname[0] == '/' {
				return refuse(name, field, "a hard link to %q, outside the mount", h.Linkname)
			}
		case tar.TypeChar, tar.TypeBlock:
			if !c.allowedDevice(h.Typeflag == tar.TypeChar, h.Devmajor, h.Devminor) {
				return refuse(name, field, "a device node %d:%d the container does not have", h.Devmajor, h.Devminor)
			}
		default:
			return refuse(name, field, "entry type %q", h.Typeflag)
		}
		if h.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			return refuse(name, field, "mode %#o is set-user-ID or set-group-ID", h.Mode)
		}
		return nil
	})
}

// eachTmpfsEntry calls fn with each entry of the tmpfs image dir/name, a
// gzipped tar, within the bounds of entries and bytes.
func eachTmpfsEntry(dir, name string, fn func(*tar.Header) error) error {
	f, _, err := openRegular(dir, name)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return refuse(name, "", "not a gzip stream: %v", err)
	}
	lr := &io.LimitedReader{R: gz, N: maxTmpfsBytes + 1}
	tr := tar.NewReader(lr)
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if lr.N <= 0 {
			return refuse(name, "", "more than %d bytes of contents", maxTmpfsBytes)
		}
		if err != nil {
			return refuse(name, "", "%v", err)
		}
		if n >= maxTmpfsEntries {
			return refuse(name, "", "more than %d entries", maxTmpfsEntries)
		}
		if err := fn(h); err != nil {
			return err
		}
	}
}

var (
	mountsImage = regexp.MustCompile(`^mountpoints-[0-9]+\.img$`)
	tmpfsImage  = regexp.MustCompile(`^tmpfs-dev-([0-9]+)\.tar\.gz\.img$`)
)

// tmpfsLinks are the symbolic links the restore extracts into the tmpfs
// mounts (tmpfs-dev-<mnt_id>.tar.gz.img; criu/filesystems.c,
// tmpfs_restore), by container path (the mount's mountpoint in
// mountpoints-*.img, then the entry's name), to their targets: runc's
// /dev/fd -> /proc/self/fd among them.
func tmpfsLinks(dir string) (map[string]string, error) {
	names, err := imageNames(dir, mountsImage)
	if err != nil {
		return nil, err
	}
	mps := map[uint32]string{}
	for _, n := range names {
		err := eachEntry(dir, n, "MNTS", func() *mnt.MntEntry { return new(mnt.MntEntry) }, func(m *mnt.MntEntry) error {
			mps[m.GetMntId()] = mountpointOf(m)
			return nil
		})
		if err != nil {
			return nil, asRefusal(n, err)
		}
	}
	if names, err = imageNames(dir, tmpfsImage); err != nil {
		return nil, err
	}
	links := map[string]string{}
	for _, n := range names {
		id, err := strconv.ParseUint(tmpfsImage.FindStringSubmatch(n)[1], 10, 32)
		if err != nil {
			return nil, refuse(n, "", "no mount ID")
		}
		mp, ok := mps[uint32(id)]
		if !ok {
			continue // CRIU restores no mount from it
		}
		err = eachTmpfsEntry(dir, n, func(h *tar.Header) error {
			if h.Typeflag == tar.TypeSymlink && checkPath(h.Name) == "" {
				links[path.Join(mp, path.Clean(h.Name))] = h.Linkname
			}
			return nil
		})
		if err != nil {
			return nil, asRefusal(n, err)
		}
	}
	return links, nil
}
