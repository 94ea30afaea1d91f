package restoremark

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The runtime shim's refusal is read back by cri-shim, listed with no mark
// of its own, removed with its mark, and ignored when anyone but the owner
// could have written it.
func TestRefuseRefusedRemove(t *testing.T) {
	d, m := fixture(t)
	must(t, d.Write(id, m))
	if _, err := d.Claim(id); err != nil {
		t.Fatal(err)
	}
	if r := d.Refused(id); r != nil {
		t.Fatalf("refusal before any: %+v", r)
	}
	want := Refusal{Image: "files.img", Field: "file 1 REG reg.name", Reason: `"/secret/token": uid 1000 cannot open it for reading`}
	must(t, d.Refuse(id, want))
	fi, err := os.Stat(filepath.Join(d.Path, id+refusedSuffix))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("refusal file: %v %v", fi, err)
	}
	if got := d.Refused(id); got == nil || *got != want {
		t.Fatalf("refused: %+v, want %+v", got, want)
	}
	if l, err := d.List(); err != nil || len(l) != 1 || l[0].ID != id || !l[0].Claimed {
		t.Fatalf("list with a refusal: %+v %v", l, err)
	}
	must(t, os.Chmod(filepath.Join(d.Path, id+refusedSuffix), 0o666))
	if got := d.Refused(id); got != nil {
		t.Fatalf("a refusal others may write was believed: %+v", got)
	}
	must(t, d.Remove(id))
	if ents, _ := os.ReadDir(d.Path); len(ents) != 0 {
		t.Fatalf("left after remove: %v", ents)
	}
	huge := Refusal{Image: "core-1.img", Reason: strings.Repeat("x", 10*maxMarkSize)}
	must(t, d.Refuse(id, huge))
	if got := d.Refused(id); got == nil || len(got.Reason) != maxMarkSize/4 {
		t.Fatalf("a long reason was not cut to %d bytes: %+v", maxMarkSize/4, got)
	}
	if err := d.Refuse("../x", want); err == nil {
		t.Fatal("a refusal for an ID that is no containerd identifier was written")
	}
}
