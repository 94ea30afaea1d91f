package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

// critestNotRun reads testdata/critest-not-run.txt: the specs this test bed
// cannot run (their reasons are in the file).
func critestNotRun(t testing.TB) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join(node.repo, "test", "e2e", "testdata", "critest-not-run.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	specs := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			specs[l] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return specs
}

// baselineRecord is one cached direct run of critest: the inputs its key
// was made of, for whoever reads the file, and each spec's result.
type baselineRecord struct {
	Key     string            `json:"key"`
	Inputs  map[string]string `json:"inputs"`
	Results map[string]string `json:"results"`
}

// critestBaseline is critest's run against containerd directly, and where it
// came from. The result depends only on what critest talks to: critest,
// containerd and its runc shim, runc, CRIU, the kernel, containerd's config
// (the node's paths aside), the registry's images and the specs skipped. A
// run is cached under $STACK/critest-baseline by a hash of all of those, so
// it is made again whenever one changes, and a record whose key does not
// hash to its file name is not used. The long tier always runs it. Only a
// run with no failure is cached.
func critestBaseline(t testing.TB, skip []string, run func() map[string]string) (map[string]string, string) {
	t.Helper()
	inputs, key, err := baselineKey(skip)
	if err != nil {
		t.Logf("critest baseline not cached: %v", err)
		return run(), "run now"
	}
	path := filepath.Join(node.env["STACK"], "critest-baseline", key+".json")
	if !longTier() {
		if b, err := os.ReadFile(path); err == nil {
			var rec baselineRecord
			if err := json.Unmarshal(b, &rec); err == nil && rec.Key == key && keyOf(rec.Inputs) == key && len(rec.Results) > 0 {
				return rec.Results, "cached " + filepath.Base(path)
			}
			t.Logf("critest baseline %s does not match its key: run again", path)
		}
	}
	res := run()
	if countStatus(res, "failed") > 0 {
		return res, "run now"
	}
	b, err := json.MarshalIndent(baselineRecord{Key: key, Inputs: inputs, Results: res}, "", "  ")
	if err == nil {
		err = os.MkdirAll(filepath.Dir(path), 0o755)
	}
	if err == nil {
		err = statefile.WriteFile(path, b, 0o644)
	}
	if err != nil {
		t.Logf("critest baseline not cached: %v", err)
	}
	return res, "run now, cached"
}

// baselineKey hashes what a direct critest run depends on.
func baselineKey(skip []string) (map[string]string, string, error) {
	inputs := map[string]string{"skip": strings.Join(skip, " ")}
	path := node.env["BIN"] + ":" + os.Getenv("PATH")
	for _, b := range []string{"critest", "containerd", "containerd-shim-runc-v2", "runc", "criu"} {
		p, err := lookPathIn(b, path)
		if err != nil {
			return nil, "", err
		}
		sum, err := fileSHA256(p)
		if err != nil {
			return nil, "", err
		}
		inputs[b] = sum
	}
	if mk := filepath.Join(node.env["STACK"], "images", "mkimage"); fileExists(mk) {
		sum, err := fileSHA256(mk)
		if err != nil {
			return nil, "", err
		}
		inputs["registry images (mkimage)"] = sum
	}
	rel, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return nil, "", err
	}
	inputs["kernel"] = strings.TrimSpace(string(rel))
	cfg, err := os.ReadFile(filepath.Join(node.env["NODE_RUN"], "containerd", "config.toml"))
	if err != nil {
		return nil, "", err
	}
	// The node's paths and the checkout's aside: the runc handler runs this
	// checkout's runtime shim, which hands every container it has not
	// marked for a restore to runc's shim unchanged (docs/restore-route.md),
	// so critest's containers never see it and its build is not an input.
	c := strings.NewReplacer(node.env["NODE_RUN"], "$NODE_RUN", node.env["NODE_DATA"], "$NODE_DATA",
		node.env["REGISTRY_ADDR"], "$REGISTRY_ADDR", node.repo, "$REPO").Replace(string(cfg))
	sum := sha256.Sum256([]byte(c))
	inputs["containerd config"] = hex.EncodeToString(sum[:])
	return inputs, keyOf(inputs), nil
}

// keyOf is the hash of inputs (json.Marshal sorts a map's keys).
func keyOf(inputs map[string]string) string {
	b, _ := json.Marshal(inputs)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

func lookPathIn(name, path string) (string, error) {
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return filepath.EvalSymlinks(p)
		}
	}
	return "", fmt.Errorf("%s not found in %s", name, path)
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
