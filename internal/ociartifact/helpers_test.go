package ociartifact

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/layout"
)

// member is one entry of a test archive.
type member struct {
	name string
	typ  byte
	body []byte
}

// goodMembers is what internal/capture writes into a container archive, with
// pages of the given size.
func goodMembers(pages int) []member {
	r := rand.New(rand.NewPCG(uint64(pages), 7))
	p := make([]byte, pages)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return []member{
		{"config.dump", tar.TypeReg, []byte(`{"id":"c","rootfsImageRef":"sha256:` + strings.Repeat("e", 64) + `"}`)},
		{"spec.dump", tar.TypeReg, []byte(`{"ociVersion":"1.2.0"}`)},
		{"status.dump", tar.TypeReg, []byte(`{}`)},
		{"container.log", tar.TypeReg, []byte("log\n")},
		{"rootfs-diff.tar", tar.TypeReg, []byte("diff")},
		{"checkpoint/", tar.TypeDir, nil},
		{"checkpoint/inventory.img", tar.TypeReg, []byte("inv")},
		{"checkpoint/pages-1.img", tar.TypeReg, p},
	}
}

func tarBytes(t testing.TB, ms []member) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, m := range ms {
		h := &tar.Header{Name: m.name, Typeflag: m.typ, Mode: 0o600, Size: int64(len(m.body)), ModTime: time.Unix(1, 0)}
		if m.typ == tar.TypeSymlink || m.typ == tar.TypeLink {
			h.Linkname, h.Size = "/etc/shadow", 0
		}
		if m.typ == tar.TypeDir {
			h.Mode = 0o700
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write(m.body)
		}
	}
	tw.Close()
	return b.Bytes()
}

// writeCheckpoint writes a complete pod checkpoint with the given container
// archives into root/name, as internal/capture lays one out.
func writeCheckpoint(t testing.TB, root, name string, archives map[string][]byte, order ...string) string {
	t.Helper()
	dir := filepath.Join(root, name)
	must(t, os.MkdirAll(filepath.Join(dir, "containers"), 0o700))
	m := layout.Manifest{FormatVersion: layout.Version, CheckpointedAt: time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC),
		Pod:     layout.PodInfo{Name: "web", Namespace: "default", UID: "uid-1", SandboxID: "sb1"},
		Runtime: "2.2.1", CRIUVersion: "4.1", Kernel: "6.8", Managed: true}
	for _, c := range order {
		b := archives[c]
		must(t, os.WriteFile(filepath.Join(dir, layout.ArchiveName(c)), b, 0o600))
		m.Containers = append(m.Containers, layout.ContainerEntry{Name: c, ID: "id-" + c, Archive: layout.ArchiveName(c),
			Image: "docker.io/library/busybox:1.36", ImageRef: "sha256:abc", SizeBytes: int64(len(b))})
		m.SizeBytes += int64(len(b))
	}
	mb, err := json.MarshalIndent(&m, "", "  ")
	must(t, err)
	sb, err := protojson.MarshalOptions{Multiline: true}.Marshal(&runtimeapi.PodSandboxStatusResponse{
		Status: &runtimeapi.PodSandboxStatus{Id: "sb1", Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "uid-1"}}})
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, layout.SandboxFile), sb, 0o600))
	must(t, os.WriteFile(filepath.Join(dir, layout.ManifestFile), mb, 0o600))
	return dir
}

// twoContainers writes a checkpoint of containers app and sidecar.
func twoContainers(t testing.TB, root, name string) string {
	return writeCheckpoint(t, root, name, map[string][]byte{
		"app": tarBytes(t, goodMembers(256<<10)), "sidecar": tarBytes(t, goodMembers(4096)),
	}, "app", "sidecar")
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// testRegistry is go-containerregistry's in-process registry on loopback,
// with a transport that counts the requests that store content and may
// rewrite responses.
type testRegistry struct {
	host string
	tr   *countingTransport
}

func newTestRegistry(t testing.TB) *testRegistry {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return &testRegistry{host: strings.TrimPrefix(srv.URL, "http://"), tr: &countingTransport{rt: http.DefaultTransport}}
}

func (r *testRegistry) reg() Registry { return Registry{PlainHTTP: true, Transport: r.tr} }

func (r *testRegistry) ref(s string) string { return r.host + "/" + s }

type countingTransport struct {
	rt http.RoundTripper
	mu sync.Mutex
	// blobWrites counts blob upload requests (POST, PATCH, PUT under
	// /blobs/uploads/); manifestPuts counts manifest PUTs.
	blobWrites, manifestPuts int
	// rewrite, if set, may replace a response body.
	rewrite func(req *http.Request, body []byte) []byte
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	switch {
	case strings.Contains(req.URL.Path, "/blobs/uploads/") && req.Method != http.MethodGet && req.Method != http.MethodHead:
		c.blobWrites++
	case strings.Contains(req.URL.Path, "/manifests/") && req.Method == http.MethodPut:
		c.manifestPuts++
	}
	rw := c.rewrite
	c.mu.Unlock()
	resp, err := c.rt.RoundTrip(req)
	if err != nil || rw == nil || req.Method != http.MethodGet || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	b = rw(req, b)
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", itoa(len(b)))
	return resp, nil
}

func (c *countingTransport) reset() (blobs, manifests int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	blobs, manifests = c.blobWrites, c.manifestPuts
	c.blobWrites, c.manifestPuts = 0, 0
	return
}

func itoa(n int) string { return strconv.Itoa(n) }

// everyNS is an allow-list entry's namespaces allowing every namespace.
var everyNS = []string{config.AllNamespaces}
