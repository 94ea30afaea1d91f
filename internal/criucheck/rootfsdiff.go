package criucheck

// A checkpoint's rootfs-diff.tar is a layer tar (gzip or plain, with OCI
// whiteouts) that the runtime shim applies as root to the new container's
// rootfs before CRIU restores, with containerd's archive.Apply. That applier
// keeps what the tar says: owners (Lchown), set-user-ID and set-group-ID
// bits (lchmod), device nodes and FIFOs (mknod), every SCHILY.xattr record
// (security.capability gives a file capabilities, system.posix_acl_* grants
// access), and it expands compressed data without a bound
// (pkg/archive/tar.go, applyNaive and createTarFile). So a diff is held to
// what the container's own processes could have made of their rootfs: a
// set-user-ID root binary added by a diff would run with euid 0 in a pod of
// user 1000.
//
// The rules, one header at a time (RootfsDiff.Filter), used both by
// CheckRootfsDiff (cri-shim at staging and the runtime shim before anything
// is applied) and as archive.Apply's filter while the diff is applied:
//   - entry types: regular files, directories, symlinks and hard links only;
//   - no set-user-ID or set-group-ID bit (the sticky bit only restricts);
//   - extended attributes: user.* only;
//   - owners: uid 0 or the spec's user, gid 0 or one of the spec's groups,
//     unless the spec's permitted set has CAP_CHOWN (its processes could then
//     give a file any owner themselves);
//   - names and hard link targets inside the tree: no absolute name, no ..
//     after cleaning, no NUL, at most PATH_MAX bytes; symlink targets may
//     point anywhere (the applier resolves them inside the rootfs) but have
//     no NUL and at most PATH_MAX bytes;
//   - OCI whiteouts (.wh.<name>, .wh..wh..opq) are empty regular files with a
//     name they can remove;
//   - bounds: the expanded tar stream (headers, names, data) is counted as
//     it is read and may not pass maxBytes; a header whose size would pass
//     it is refused before its data is read; at most maxDiffEntries entries,
//     maxDiffNameBytes of names together.
//
// While the diff is applied, each entry is also held to where it lands: only
// what the container's user could have written to the rootfs as it then is
// (RootfsDiff.ApplyFilter, diffwrites.go).

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// RootfsDiffImage names the rootfs diff in refusals (Refusal.Image).
const RootfsDiffImage = "rootfs-diff.tar"

// Bounds of a rootfs diff besides its expanded bytes. containerd's applier
// keeps every entry's path in memory while it applies a diff (applyNaive's
// unpackedPaths), so the entries and their names are bounded together too.
const (
	maxDiffEntries   = 1000000
	maxDiffNameBytes = 64 << 20
	maxDiffPath      = unix.PathMax
)

// OCI whiteouts (image-spec layer.md, "Whiteouts"), as containerd's applier
// reads them.
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// RootfsDiff is a rootfs diff opened for reading under the rules of one
// container's spec. Read gives its expanded tar stream, at most maxBytes of
// it (a *Refusal past that); Filter decides each header. A diff is read once:
// by CheckRootfsDiff, or by archive.Apply with ApplyFilter as its filter.
type RootfsDiff struct {
	close func() error
	r     io.Reader
	p     *policy
	max   int64
	// read is the expanded bytes read so far; entries and names count the
	// headers Filter was given.
	read    int64
	entries int
	names   int64
}

// OpenRootfsDiff opens the diff at path (a regular file, not followed
// through a symlink), plain or gzip, for the container of spec, with at most
// maxBytes of it expanded. Another compression is refused: zstd's decoder
// may allocate a window of hundreds of MiB a hostile frame asks for, and
// neither containerd's checkpoint nor cri-shim's writes one.
func OpenRootfsDiff(file string, spec *specs.Spec, maxBytes int64) (*RootfsDiff, error) {
	if spec == nil || spec.Process == nil {
		return nil, errors.New("the container's runtime spec has no process")
	}
	if maxBytes <= 0 {
		return nil, fmt.Errorf("no bound for the rootfs diff's expanded size (%d)", maxBytes)
	}
	f, _, err := openRegular(filepath.Dir(file), filepath.Base(file))
	if err != nil {
		return nil, err
	}
	ds, err := compression.DecompressStream(f)
	if err != nil {
		f.Close()
		return nil, refuse(RootfsDiffImage, "", "not a layer tar: %v", err)
	}
	closeBoth := func() error { return errors.Join(ds.Close(), f.Close()) }
	if c := ds.GetCompression(); c != compression.Uncompressed && c != compression.Gzip {
		closeBoth()
		return nil, refuse(RootfsDiffImage, "", "compressed with %s; only a plain or gzip layer tar is read", c.Extension())
	}
	// Read counts one byte past the bound.
	return &RootfsDiff{close: closeBoth, r: ds, p: policyOf(spec), max: min(maxBytes, math.MaxInt64-1)}, nil
}

// Close closes the diff.
func (d *RootfsDiff) Close() error { return d.close() }

// Read reads the expanded tar stream; past maxBytes it fails with a refusal.
func (d *RootfsDiff) Read(b []byte) (int, error) {
	if d.read > d.max {
		return 0, d.tooLarge()
	}
	if room := d.max + 1 - d.read; int64(len(b)) > room {
		b = b[:room]
	}
	n, err := d.r.Read(b)
	d.read += int64(n)
	if d.read > d.max {
		return 0, d.tooLarge()
	}
	return n, err
}

func (d *RootfsDiff) tooLarge() *Refusal {
	return refuse(RootfsDiffImage, "", "expands to more than %d bytes", d.max)
}

// Filter decides one header of the diff by the rules above: an entry is
// applied or the diff refused, never skipped. ApplyFilter adds where the
// entry lands, for archive.Apply (its archive.WithFilter).
func (d *RootfsDiff) Filter(h *tar.Header) (bool, error) {
	if err := d.header(h); err != nil {
		return false, err
	}
	return true, nil
}

func (d *RootfsDiff) header(h *tar.Header) error {
	d.entries++
	if d.entries > maxDiffEntries {
		return refuse(RootfsDiffImage, "", "more than %d entries", maxDiffEntries)
	}
	d.names += int64(len(h.Name) + len(h.Linkname))
	if d.names > maxDiffNameBytes {
		return refuse(RootfsDiffImage, "", "more than %d bytes of names", maxDiffNameBytes)
	}
	no := func(what, format string, args ...any) error {
		return refuse(RootfsDiffImage, entryField(h.Name, what), format, args...)
	}
	clean, why := insideName(h.Name)
	if why != "" {
		return no("name", "%s", why)
	}
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeDir:
	case tar.TypeSymlink:
		if h.Linkname == "" || strings.IndexByte(h.Linkname, 0) >= 0 || len(h.Linkname) > maxDiffPath {
			return no("link", "a symlink target that is empty, has a NUL or is longer than %d bytes", maxDiffPath)
		}
	case tar.TypeLink:
		if target, why := insideName(h.Linkname); why != "" || target == "." {
			return no("link", "a hard link to %q, outside the diff's tree", cutName(h.Linkname, 256))
		}
	case tar.TypeChar, tar.TypeBlock:
		return no("type", "a device node %d:%d: the applier would mknod it as root", h.Devmajor, h.Devminor)
	case tar.TypeFifo:
		return no("type", "a FIFO: only files, directories and links are applied")
	case tar.TypeGNUSparse:
		return no("type", "a sparse file: its holes would expand unbounded")
	default:
		return no("type", "entry type %q: only files, directories and links are applied", h.Typeflag)
	}
	if clean == "." && h.Typeflag != tar.TypeDir {
		return no("name", "the rootfs itself, as a %q entry", h.Typeflag)
	}
	if err := checkPAX(h, no); err != nil {
		return err
	}
	if h.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		return no("mode", "%#o is set-user-ID or set-group-ID", h.Mode&0o7777)
	}
	if err := d.checkOwner(h, no); err != nil {
		return err
	}
	if base := path.Base(clean); strings.HasPrefix(base, whiteoutPrefix) {
		gone := strings.TrimPrefix(base, whiteoutPrefix)
		switch {
		case h.Typeflag != tar.TypeReg || h.Size != 0:
			return no("whiteout", "a whiteout that is not an empty regular file")
		case base == whiteoutOpaque:
		case strings.HasPrefix(gone, whiteoutPrefix) || gone == "" || gone == "." || gone == "..":
			return no("whiteout", "a malformed whiteout name")
		}
	}
	if h.Typeflag == tar.TypeReg {
		if h.Size < 0 || h.Size > d.max-d.read {
			return no("size", "%d bytes of data; the diff may expand to %d bytes", h.Size, d.max)
		}
	}
	return nil
}

// checkPAX refuses sparse records and every extended attribute but user.*:
// security.* (capabilities, LSM labels), trusted.*, system.* (POSIX ACLs)
// would all be set as root. Records of other archivers' xattrs and ACLs,
// which containerd's applier skips today, are refused as well.
func checkPAX(h *tar.Header, no func(what, format string, args ...any) error) error {
	for _, k := range slices.Sorted(maps.Keys(h.PAXRecords)) {
		switch {
		case strings.HasPrefix(k, "GNU.sparse."):
			return no("type", "a sparse file (%s): its holes would expand unbounded", k)
		case strings.HasPrefix(k, "SCHILY.xattr."):
			if err := checkXattr(strings.TrimPrefix(k, "SCHILY.xattr."), no); err != nil {
				return err
			}
		case strings.HasPrefix(k, "LIBARCHIVE.xattr."), strings.HasPrefix(k, "SCHILY.acl."):
			return no("xattr", "record %s: only user.* extended attributes are allowed", k)
		}
	}
	//nolint:staticcheck // Xattrs is deprecated, but a reader still fills it.
	for _, k := range slices.Sorted(maps.Keys(h.Xattrs)) {
		if err := checkXattr(k, no); err != nil {
			return err
		}
	}
	return nil
}

func checkXattr(name string, no func(what, format string, args ...any) error) error {
	if strings.HasPrefix(name, "user.") && len(name) > len("user.") {
		return nil
	}
	why := "only user.* extended attributes are allowed"
	switch {
	case name == "security.capability":
		why = "file capabilities; " + why
	case strings.HasPrefix(name, "system.posix_acl"):
		why = "a POSIX ACL; " + why
	}
	return no("xattr "+cutName(name, 64), "%s", why)
}

// checkOwner refuses an owner the container's processes could not give a
// file themselves (without CAP_CHOWN: their own user and groups), root's
// aside: the image's own files are root's.
func (d *RootfsDiff) checkOwner(h *tar.Header, no func(what, format string, args ...any) error) error {
	// -1 leaves an owner unchanged in chown(2), and a base-256 tar number
	// may be negative or wider than 32 bits.
	valid := func(id int) bool { return id >= 0 && id < math.MaxUint32 }
	if !valid(h.Uid) {
		return no("uid", "%d is not a user ID", h.Uid)
	}
	if !valid(h.Gid) {
		return no("gid", "%d is not a group ID", h.Gid)
	}
	if d.p.holds("CAP_CHOWN") {
		return nil
	}
	if uid := uint32(h.Uid); uid != 0 && uid != d.p.uid {
		return no("uid", "owned by uid %d; the container's user is %d, without CAP_CHOWN", uid, d.p.uid)
	}
	if gid := uint32(h.Gid); gid != 0 && !d.p.groups[gid] {
		return no("gid", "owned by gid %d, not one of the container's groups, without CAP_CHOWN", gid)
	}
	return nil
}

// insideName cleans a name of the diff and says why it is not inside the
// tree ("" when it is).
func insideName(name string) (string, string) {
	switch {
	case name == "":
		return "", "an empty name"
	case strings.IndexByte(name, 0) >= 0:
		return "", "a name with a NUL"
	case len(name) > maxDiffPath:
		return "", fmt.Sprintf("a name of %d bytes, more than %d", len(name), maxDiffPath)
	case path.IsAbs(name):
		return "", "an absolute name"
	}
	clean := path.Clean(name)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", "a name outside the rootfs"
	}
	return clean, ""
}

// CheckRootfsDiff refuses the rootfs diff at file unless the container of
// spec could have made every entry of it itself, within maxBytes expanded.
// The diff is read once, with bounded memory: data is counted as it expands,
// not trusted from the headers. A *Refusal names the entry; another error is
// a diff that cannot be opened.
func CheckRootfsDiff(file string, spec *specs.Spec, maxBytes int64) error {
	d, err := OpenRootfsDiff(file, spec, maxBytes)
	if err != nil {
		return err
	}
	defer d.Close()
	tr := tar.NewReader(d)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return diffReadError(err)
		}
		if _, err := d.Filter(h); err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, tr); err != nil {
			return diffReadError(err)
		}
	}
}

// diffReadError is a read of the diff that failed: the bound's refusal, or a
// stream that is not a tar.
func diffReadError(err error) error {
	var r *Refusal
	if errors.As(err, &r) {
		return err
	}
	return refuse(RootfsDiffImage, "", "not a layer tar: %v", err)
}

// RefusalKind is the kind of check a refusal of image belongs to, for
// metrics: KindOf's, and "rootfs_diff" for the rootfs diff.
func RefusalKind(image string) string {
	if image == RootfsDiffImage {
		return "rootfs_diff"
	}
	return KindOf(image)
}

// entryField is a refusal's Field for entry name: the name, quoted when it
// is empty or has spaces or unprintable bytes, cut to a readable length,
// then what.
func entryField(name, what string) string {
	name = cutName(name, 256)
	if q := strconv.Quote(name); name == "" || q[1:len(q)-1] != name || strings.ContainsRune(name, ' ') {
		name = q
	}
	return name + " " + what
}

func cutName(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
