package v1alpha1

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The committed deepcopy code and CRD are what controller-gen (pinned in
// build/codegen) makes of these types now: a change to types.go without
// `make generate` fails here.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("go not on PATH: the generator is built with it: %v", err)
	}
	repo, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(repo, "build/codegen/generate.sh"), out)
	cmd.Env = append(os.Environ(), "CONTROLLER_GEN="+filepath.Join(out, "controller-gen"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generate.sh: %v\n%s", err, b)
	}
	for _, f := range []string{
		"pkg/apis/checkpoint/v1alpha1/zz_generated.deepcopy.go",
		"deploy/crd/checkpoint.cri-shim.io_podcheckpoints.yaml",
	} {
		want, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(repo, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `make generate`", f)
		}
	}
	// Nothing generated that is not committed (a new type or group).
	err = filepath.Walk(out, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() || fi.Name() == "controller-gen" {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		if _, err := os.Stat(filepath.Join(repo, rel)); err != nil {
			t.Errorf("%s is generated but not committed: run `make generate`", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
