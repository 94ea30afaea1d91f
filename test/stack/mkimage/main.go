// Command mkimage writes single-layer OCI image archives that `ctr images import`
// accepts, so the test node needs no registry:
//
//	mkimage --name docker.io/library/busybox:cri-shim --busybox /bin/busybox --cmd sh --out busybox.tar
//	mkimage --name localhost/cri-shim/pause:1 --file /path/pause:/pause --entrypoint /pause --out pause.tar
//	mkimage --name 127.0.0.1:5000/e2e-test-images/busybox:1.29-2 --busybox /bin/busybox --push
//
// With --push the image goes to the (plain-HTTP, loopback) registry named in
// --name instead of an archive; extra --tag values push the same manifest again.
//
// Image names must be fully qualified: the CRI looks images up by full name and
// would otherwise try to pull.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// epoch keeps archives reproducible: the same inputs give the same digests.
var epoch = time.Unix(0, 0)

func main() {
	var files, entrypoint, cmd, env listFlag
	name := flag.String("name", "", "fully qualified image name")
	out := flag.String("out", "", "output archive")
	busybox := flag.String("busybox", "", "static busybox binary: installed as /bin/busybox with a symlink per applet")
	user := flag.String("user", "", "image config User")
	push := flag.Bool("push", false, "push to the plain-HTTP registry in --name instead of writing --out")
	var tags listFlag
	flag.Var(&tags, "tag", "extra tag to push the same manifest under (repeatable, with --push)")
	flag.Var(&files, "file", "SRC:DST file to add (repeatable)")
	flag.Var(&entrypoint, "entrypoint", "Entrypoint element (repeatable)")
	flag.Var(&cmd, "cmd", "Cmd element (repeatable)")
	flag.Var(&env, "env", "Env entry (repeatable); PATH is always set")
	flag.Parse()
	if *push {
		*out = "-"
	}
	if *name == "" || *out == "" || !strings.Contains(strings.SplitN(*name, "/", 2)[0], ".") && !strings.HasPrefix(*name, "localhost/") {
		fmt.Fprintln(os.Stderr, "mkimage: --name must be fully qualified (registry/repo:tag) and --out given")
		os.Exit(2)
	}
	img, err := build(*name, *busybox, *user, files, entrypoint, cmd, env)
	if err == nil {
		if *push {
			err = img.push(*name, tags)
		} else {
			err = img.writeArchive(*out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// image is a built single-layer image: its blobs by digest, and its manifest.
type image struct {
	blobs    map[string][]byte
	manifest []byte
	mDigest  string
	index    []byte
}

func build(name, busybox, user string, files, entrypoint, cmd, env []string) (*image, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	dir := func(p string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: mode, ModTime: epoch})
	}
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "root", "var", "var/log"} {
		if err := dir(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := dir("tmp", 0o1777); err != nil {
		return nil, err
	}
	add := func(dst string, data []byte, mode int64) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add("/etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/false\nnobody:x:65534:65534:nobody:/:/bin/false\n"), 0o644); err != nil {
		return nil, err
	}
	if err := add("/etc/group", []byte("root:x:0:\nwww-data:x:33:\nnogroup:x:65534:\n"), 0o644); err != nil {
		return nil, err
	}
	if busybox != "" {
		b, err := os.ReadFile(busybox)
		if err != nil {
			return nil, err
		}
		if err := add("/bin/busybox", b, 0o755); err != nil {
			return nil, err
		}
		list, err := exec.Command(busybox, "--list").Output()
		if err != nil {
			return nil, fmt.Errorf("%s --list: %w", busybox, err)
		}
		applets := strings.Fields(string(list))
		sort.Strings(applets)
		for _, a := range applets {
			if a == "busybox" {
				continue
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
	}
	for _, f := range files {
		src, dst, ok := strings.Cut(f, ":")
		if !ok {
			return nil, fmt.Errorf("--file %q: want SRC:DST", f)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		if err := add(dst, b, 0o755); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}

	blobs := map[string][]byte{}
	put := func(b []byte) (string, int) {
		sum := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = b
		return d, len(b)
	}
	layerDigest, layerSize := put(layer.Bytes())
	cfg := map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Env":        append([]string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"}, env...),
			"Entrypoint": nilIfEmpty(entrypoint),
			"Cmd":        nilIfEmpty(cmd),
			"User":       user,
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	}
	cfgJSON, _ := json.Marshal(cfg)
	cfgDigest, cfgSize := put(cfgJSON)
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfgDigest, "size": cfgSize},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": layerSize}},
	})
	mDigest, mSize := put(manifest)
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json",
			"digest":    mDigest, "size": mSize,
			"platform": map[string]string{"architecture": "amd64", "os": "linux"},
			"annotations": map[string]string{
				"io.containerd.image.name":          name,
				"org.opencontainers.image.ref.name": name,
			},
		}},
	})

	return &image{blobs: blobs, manifest: manifest, mDigest: mDigest, index: index}, nil
}

func (img *image) writeArchive(out string) error {
	blobs, index := img.blobs, img.index
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	defer os.Remove(out + ".tmp")
	ow := tar.NewWriter(f)
	write := func(p string, b []byte) error {
		if err := ow.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: 0o644, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := ow.Write(b)
		return err
	}
	if err := write("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := write("index.json", index); err != nil {
		return err
	}
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err := write("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), blobs[d]); err != nil {
			return err
		}
	}
	if err := ow.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// push uploads the blobs and the manifest to a registry speaking the OCI
// distribution API over plain HTTP (the loopback test registry).
func (img *image) push(name string, extraTags []string) error {
	host, rest, ok := strings.Cut(name, "/")
	if !ok {
		return fmt.Errorf("--name %q: no registry host", name)
	}
	repo, tag, ok := strings.Cut(rest, ":")
	if !ok {
		tag = "latest"
	}
	base := "http://" + host + "/v2/" + repo
	client := &http.Client{Timeout: 60 * time.Second}
	for d, b := range img.blobs {
		if d == img.mDigest {
			continue
		}
		resp, err := client.Head(base + "/blobs/" + d)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				continue
			}
		}
		resp, err = client.Post(base+"/blobs/uploads/", "application/octet-stream", nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("start upload to %s: %s", base, resp.Status)
		}
		loc, err := resp.Location()
		if err != nil {
			return err
		}
		q := loc.Query()
		q.Set("digest", d)
		loc.RawQuery = q.Encode()
		req, _ := http.NewRequest(http.MethodPut, loc.String(), bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err = client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("upload %s: %s", d, resp.Status)
		}
	}
	for _, t := range append([]string{tag}, extraTags...) {
		req, _ := http.NewRequest(http.MethodPut, base+"/manifests/"+t, bytes.NewReader(img.manifest))
		req.Header.Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("put manifest %s:%s: %s", repo, t, resp.Status)
		}
	}
	return nil
}
