package criu

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// writeFileSync writes a file and makes it durable before returning.
func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeManifest(dir string, m *layout.Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+layout.ManifestFile+".tmp")
	if err := writeFileSync(tmp, b); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, layout.ManifestFile))
}
