package e2e

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ociResult is one checkpoint's trip through the stack's loopback registry:
// cri-shim's push and pull (the CLI, as an operator runs it), and a blob of
// the same size written and read straight through go-containerregistry, the
// registry's raw throughput in the same run.
type ociResult struct {
	bytes            int64
	push, pull       time.Duration
	rawPush, rawPull time.Duration
}

// registryFigures pushes the checkpoint in dir and pulls it back, then does
// the same with one raw blob of its size.
func registryFigures(b *testing.B, dir string, size int64, tag string) ociResult {
	b.Helper()
	addr := startRegistry(b)
	r := ociResult{bytes: size}
	ref := addr + "/bench/pod-checkpoint:" + tag
	run := func(args ...string) []byte {
		cmd := exec.Command(node.env["SHIM_BIN"], append(args, "--config", node.env["SHIM_CONFIG"], "--plain-http", "-o", "json")...)
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("cri-shim %v: %v", args, err)
		}
		return out
	}
	t0 := time.Now()
	var pushed struct{ Ref string }
	if err := json.Unmarshal(run("checkpoint", "push", dir, ref), &pushed); err != nil {
		b.Fatal(err)
	}
	r.push = time.Since(t0)
	pulledName := "bench-oci-pull-" + tag
	os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], pulledName))
	t0 = time.Now()
	run("checkpoint", "pull", pushed.Ref, pulledName)
	r.pull = time.Since(t0)
	os.RemoveAll(filepath.Join(node.env["CHECKPOINTS"], pulledName))

	// The raw blob: random bytes (nothing to deduplicate), uncompressed.
	blob := filepath.Join(b.TempDir(), "blob")
	l := randomBlob(b, blob, size)
	repo, err := name.NewRepository(addr+"/bench/raw", name.Insecure)
	if err != nil {
		b.Fatal(err)
	}
	t0 = time.Now()
	if err := remote.WriteLayer(repo, l); err != nil {
		b.Fatal(err)
	}
	r.rawPush = time.Since(t0)
	t0 = time.Now()
	got, err := remote.Layer(repo.Digest(l.digest.String()))
	if err != nil {
		b.Fatal(err)
	}
	rc, err := got.Compressed()
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, rc) // the digest is checked as it is read
	rc.Close()
	if err != nil || n != size {
		b.Fatalf("raw pull: %d bytes, %v", n, err)
	}
	r.rawPull = time.Since(t0)
	return r
}

// blobLayer is a file sent as one blob, as it is.
type blobLayer struct {
	path   string
	digest v1.Hash
	size   int64
}

func (l *blobLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *blobLayer) Size() (int64, error)                { return l.size, nil }
func (l *blobLayer) MediaType() (types.MediaType, error) { return types.OCIUncompressedLayer, nil }
func (l *blobLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }
func (l *blobLayer) DiffID() (v1.Hash, error)            { return l.digest, nil }
func (l *blobLayer) Uncompressed() (io.ReadCloser, error) {
	return os.Open(l.path)
}

// randomBlob writes size random bytes to path and returns it as a layer.
func randomBlob(b *testing.B, path string, size int64) *blobLayer {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	var seed [32]byte // a new blob each run: a registry that has it would skip the upload
	binary.LittleEndian.PutUint64(seed[:], uint64(time.Now().UnixNano()))
	src := rand.NewChaCha8(seed)
	buf := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(buf)) {
		chunk := buf[:min(int64(len(buf)), left)]
		_, _ = src.Read(chunk)
		h.Write(chunk)
		if _, err := f.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	return &blobLayer{path: path, size: size, digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}}
}

func mbps(n int64, d time.Duration) string {
	return fmt.Sprintf("%.0f MB/s", float64(n)/d.Seconds()/1e6)
}
