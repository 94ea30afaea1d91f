package ociartifact

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/statefile"
)

// PullOptions bound and place a pull.
type PullOptions struct {
	// Root is the checkpoint root; the checkpoint is written to Root/Name.
	Root string
	// Name is the new checkpoint's name; empty: <namespace>-<pod>-<time> of
	// the pulled checkpoint (what 'cri-shim checkpoint' names it).
	Name string
	// reserved lets Name be a reserved name (restore pulls, restorepull.go).
	reserved bool
	// MaxBytes caps the sum of the archives' sizes (0: DefaultMaxBytes).
	MaxBytes int64
	// Written, if not nil, is told of every chunk of archive written.
	Written func(n int64)
	// Check, if not nil, judges the pulled manifest.json (parsed, and in
	// agreement with the index) before an archive byte is fetched; its
	// error ends the pull.
	Check func(*layout.Manifest) error
	// Planned, if not nil, is told the checkpoint's total archive bytes
	// once the images are checked, before the archives are fetched.
	Planned func(total int64)
	// Reserve, if not nil, is asked for room for the checkpoint's archive
	// bytes after Planned, before the archives are fetched (the node-wide
	// cap on pulled checkpoints); its error ends the pull, and release is
	// called once the pull has ended, its directory in place or not.
	Reserve func(total int64) (release func(), err error)
}

// DefaultMaxBytes caps a pulled checkpoint's archives.
const DefaultMaxBytes = 64 << 30

// Pulled is what Pull wrote.
type Pulled struct {
	Name     string
	Dir      string
	Digest   v1.Hash
	Bytes    int64
	Manifest *layout.Manifest
}

// Pull fetches the pod checkpoint at ref into a new checkpoint directory
// Root/Name. Every manifest and blob is size-capped before it is read and
// its digest checked as it streams; the archives are checked member by
// member; manifest.json is validated by criu's parser and agrees with the
// index; the directory is written under a temporary name, manifest.json
// last, and renamed into place only when complete.
func Pull(ctx context.Context, ref string, reg Registry, o PullOptions) (*Pulled, error) {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	r, opts, err := reg.connect(ctx, ref)
	if err != nil {
		return nil, err
	}
	repo := r.Context()
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", r, err)
	}
	if desc.MediaType != types.OCIImageIndex {
		return nil, refusedf("%s: %w: media type %q, want an OCI image index", r, errNotCheckpoint, desc.MediaType)
	}
	if err := checkRaw(desc.Manifest, desc.Digest, int64(len(desc.Manifest))); err != nil {
		return nil, err
	}
	idx, err := parseIndex(desc.Manifest)
	if err != nil {
		return nil, refusedf("%s: %w", r, err)
	}
	f := fetcher{repo: repo, opts: opts}

	rawPod, err := f.manifest(idx.pod)
	if err != nil {
		return nil, err
	}
	mfDesc, sbDesc, err := parsePodArtifact(rawPod)
	if err != nil {
		return nil, refused(err)
	}
	rawManifest, err := f.smallBlob(mfDesc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", layout.ManifestFile, err)
	}
	m, err := layout.ParseManifest(rawManifest)
	if err != nil {
		return nil, refused(err)
	}
	if err := checkAgrees(idx, m); err != nil {
		return nil, refused(err)
	}
	if o.Check != nil {
		if err := o.Check(m); err != nil {
			return nil, err
		}
	}
	rawSandbox, err := f.smallBlob(sbDesc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", layout.SandboxFile, err)
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(rawSandbox, &runtimeapi.PodSandboxStatusResponse{}); err != nil {
		return nil, refusedf("%s: %w", layout.SandboxFile, err)
	}

	// Every container image is checked before an archive byte is fetched.
	archives := make([]v1.Descriptor, len(idx.containers))
	var total int64
	for i, c := range idx.containers {
		raw, err := f.manifest(c.desc)
		if err != nil {
			return nil, err
		}
		cfgDesc, arDesc, err := parseContainerManifest(raw, c.name)
		if err != nil {
			return nil, refused(err)
		}
		rawCfg, err := f.smallBlob(cfgDesc)
		if err != nil {
			return nil, fmt.Errorf("container %s: config: %w", c.name, err)
		}
		if err := checkImageConfig(rawCfg, c.name, arDesc.Digest); err != nil {
			return nil, refused(err)
		}
		if e := m.Containers[i]; e.SizeBytes != 0 && e.SizeBytes != arDesc.Size {
			return nil, refusedf("container %s: archive of %d bytes, %s says %d", c.name, arDesc.Size, layout.ManifestFile, e.SizeBytes)
		}
		if total += arDesc.Size; total > o.MaxBytes {
			return nil, fmt.Errorf("checkpoint archives exceed the cap of %d bytes", o.MaxBytes)
		}
		archives[i] = arDesc
	}
	if o.Planned != nil {
		o.Planned(total)
	}
	if o.Reserve != nil {
		release, err := o.Reserve(total)
		if err != nil {
			return nil, err
		}
		defer release()
	}

	nm := o.Name
	if nm == "" {
		nm = fmt.Sprintf("%s-%s-%s", m.Pod.Namespace, m.Pod.Name, m.CheckpointedAt.UTC().Format("20060102T150405Z"))
	}
	if err := checkPullName(nm, o.reserved); err != nil {
		return nil, err
	}
	w, err := newPullDir(o.Root, nm)
	if err != nil {
		return nil, err
	}
	defer w.abandon()
	for i, c := range idx.containers {
		if err := w.write(layout.ArchiveName(c.name), func(dst io.Writer) error {
			return f.archive(archives[i], dst, o.Written)
		}); err != nil {
			return nil, fmt.Errorf("container %s: %w", c.name, err)
		}
	}
	dir, err := w.finish(rawSandbox, rawManifest)
	if err != nil {
		return nil, err
	}
	if _, err := layout.ReadManifest(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Pulled{Name: nm, Dir: dir, Digest: desc.Digest, Bytes: total, Manifest: m}, nil
}

// checkPullName refuses names criu would not restore by and the reserved
// names (layout.CheckNewName), unless reserved: a restore's own pull into
// its oci- directory.
func checkPullName(n string, reserved bool) error {
	if reserved {
		return layout.CheckName(n)
	}
	return layout.CheckNewName(n)
}

// fetcher reads manifests and blobs of one repository by digest.
type fetcher struct {
	repo name.Repository
	opts []remote.Option
}

func (f fetcher) manifest(d v1.Descriptor) ([]byte, error) {
	got, err := remote.Get(f.repo.Digest(d.Digest.String()), f.opts...)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", d.Digest, err)
	}
	if err := checkRaw(got.Manifest, d.Digest, d.Size); err != nil {
		return nil, err
	}
	return got.Manifest, nil
}

func (f fetcher) open(d v1.Descriptor) (io.ReadCloser, error) {
	l, err := remote.Layer(f.repo.Digest(d.Digest.String()), f.opts...)
	if err != nil {
		return nil, err
	}
	return l.Compressed()
}

// smallBlob reads a blob the parsers already capped (d.Size).
func (f fetcher) smallBlob(d v1.Descriptor) ([]byte, error) {
	rc, err := f.open(d)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, d.Size+1))
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", d.Digest, err)
	}
	if err := checkRaw(b, d.Digest, d.Size); err != nil {
		return nil, err
	}
	return b, nil
}

// archive streams a container archive to dst: exactly d.Size bytes whose
// digest is d.Digest, every tar member checked as it passes.
func (f fetcher) archive(d v1.Descriptor, dst io.Writer, written func(int64)) error {
	rc, err := f.open(d)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := sha256.New()
	var n int64
	src := io.TeeReader(&countingReader{r: io.LimitReader(rc, d.Size+1), add: func(k int64) {
		n += k
		if written != nil {
			written(k)
		}
	}}, io.MultiWriter(dst, h))
	if err := checkArchive(src); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, src); err != nil { // padding after the tar's end
		return fmt.Errorf("blob %s: %w", d.Digest, err)
	}
	return checkSum(h.Sum(nil), n, d.Digest, d.Size)
}

var errDigest = errors.New("content does not match its digest")

// contentRefused is a check refusing what a checkpoint's own content says
// (its index, manifests, manifest.json, archives): the same at every pull
// of its digest, unlike the registry failing. It reads as err and is also
// layout.ErrCheckpointRefused.
type contentRefused struct{ err error }

func (e *contentRefused) Error() string   { return e.err.Error() }
func (e *contentRefused) Unwrap() []error { return []error{e.err, layout.ErrCheckpointRefused} }

// refused marks err, a check of the checkpoint's content, as a refusal.
func refused(err error) error {
	if err == nil {
		return nil
	}
	return &contentRefused{err: err}
}

func refusedf(format string, a ...any) error { return refused(fmt.Errorf(format, a...)) }

// checkRaw checks bytes against a digest and size.
func checkRaw(b []byte, d v1.Hash, size int64) error {
	sum := sha256.Sum256(b)
	return checkSum(sum[:], int64(len(b)), d, size)
}

func checkSum(sum []byte, n int64, d v1.Hash, size int64) error {
	if n != size {
		return fmt.Errorf("%s: %d bytes, descriptor says %d: %w", d, n, size, errDigest)
	}
	if d.Algorithm != "sha256" || hex.EncodeToString(sum) != d.Hex {
		return fmt.Errorf("%s: got sha256:%s: %w", d, hex.EncodeToString(sum), errDigest)
	}
	return nil
}

// pullDir writes a pulled checkpoint under a temporary name in the root,
// marked incomplete (a shim starting meanwhile empties it), and renames it
// into place once manifest.json is written.
type pullDir struct {
	root, name, tmp string
}

func newPullDir(root, nm string) (*pullDir, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	root, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(filepath.Join(root, nm)); err == nil {
		return nil, fmt.Errorf("checkpoint %s already exists under %s", nm, root)
	}
	tmp, err := os.MkdirTemp(root, ".pull-"+nm+"-")
	if err != nil {
		return nil, err
	}
	w := &pullDir{root: root, name: nm, tmp: tmp}
	if err := w.write(layout.IncompleteFile, nil); err != nil {
		w.abandon()
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(tmp, "containers"), 0o700); err != nil {
		w.abandon()
		return nil, err
	}
	return w, nil
}

// write writes the new file rel (a fixed name, or layout.ArchiveName of a
// checked container name) from fill and makes it durable.
func (w *pullDir) write(rel string, fill func(io.Writer) error) error {
	f, err := os.OpenFile(filepath.Join(w.tmp, rel), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	if fill != nil {
		err = fill(bw)
	}
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// finish writes sandbox.json, then manifest.json, clears the mark and
// renames the directory into place (never over an existing one).
func (w *pullDir) finish(sandbox, manifest []byte) (string, error) {
	if err := w.write(layout.SandboxFile, bytesFill(sandbox)); err != nil {
		return "", err
	}
	tmpManifest := "." + layout.ManifestFile + ".tmp"
	if err := w.write(tmpManifest, bytesFill(manifest)); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(w.tmp, tmpManifest), filepath.Join(w.tmp, layout.ManifestFile)); err != nil {
		return "", err
	}
	if err := os.Remove(filepath.Join(w.tmp, layout.IncompleteFile)); err != nil {
		return "", err
	}
	if err := statefile.SyncDir(w.tmp); err != nil {
		return "", err
	}
	dst := filepath.Join(w.root, w.name)
	if err := renameNoReplace(w.tmp, dst); err != nil {
		return "", fmt.Errorf("checkpoint %s: %w", w.name, err)
	}
	w.tmp = ""
	return dst, statefile.SyncDir(w.root)
}

func bytesFill(b []byte) func(io.Writer) error {
	return func(w io.Writer) error { _, err := w.Write(b); return err }
}

// abandon removes the temporary directory unless finish moved it.
func (w *pullDir) abandon() {
	if w.tmp != "" {
		os.RemoveAll(w.tmp)
		w.tmp = ""
	}
}
