package layout

import (
	"encoding/json"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// WriteFileSync writes a file and makes it durable before returning.
func WriteFileSync(path string, b []byte) error {
	return writeSync(path, b, os.O_TRUNC)
}

// CreateFileSync creates path, which must not exist (no symlink followed),
// mode 0600, with b, durably; the caller syncs the directory.
func CreateFileSync(path string, b []byte) error {
	return writeSync(path, b, os.O_EXCL|unix.O_NOFOLLOW)
}

func writeSync(path string, b []byte, flag int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|flag, 0o600)
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

// WriteManifest writes m as dir's manifest.json, durably, under a
// temporary name renamed into place (the caller syncs dir).
func WriteManifest(dir string, m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+ManifestFile+".tmp")
	if err := WriteFileSync(tmp, b); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, ManifestFile))
}
