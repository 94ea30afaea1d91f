package podmgmt

import (
	"errors"
	"io/fs"
	"os"
	"testing"
)

// A sandbox announced gone on the store's lifecycle is dropped: its channel,
// records and token.
func TestGoneSandboxIsDropped(t *testing.T) {
	f := newFx(t)
	f.run(t, "o1", "orch")
	if err := f.m.store.Gone("sb"); err != nil {
		t.Fatal(err)
	}
	if f.m.get("sb") != nil || f.m.active.Load() != 0 || len(f.m.orch) != 0 {
		t.Fatal("pod still known after Gone")
	}
	if _, err := os.Stat(f.m.tokenDir("sb")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("token left: %v", err)
	}
	if keys, _ := f.m.records.List(); len(keys) != 0 {
		t.Fatalf("records left: %v", keys)
	}
}
