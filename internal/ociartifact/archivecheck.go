package ociartifact

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	crmetadata "github.com/checkpoint-restore/checkpointctl/lib"
)

// checkArchive reads a container checkpoint archive to its end and checks
// that it is one internal/criu writes (the layout of containerd's CRI
// checkpoint archive): only regular files and directories, every name a
// local path under a member criu writes, no name twice, and the members a
// restore reads all present. containerd unpacks the archive on restore; this
// keeps a pulled archive to what it would unpack from a checkpoint made here.
func checkArchive(r io.Reader) error {
	tr := tar.NewReader(r)
	seen := map[string]bool{}
	n := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("archive: %w", err)
		}
		if n++; n > maxArchiveEntries {
			return fmt.Errorf("archive has more than %d entries", maxArchiveEntries)
		}
		name, err := archiveMember(h)
		if err != nil {
			return err
		}
		if seen[name] {
			return fmt.Errorf("archive lists %q twice", name)
		}
		seen[name] = true
	}
	for _, need := range []string{crmetadata.ConfigDumpFile, crmetadata.SpecDumpFile, crmetadata.StatusDumpFile, crmetadata.RootFsDiffTar} {
		if !seen[need] {
			return fmt.Errorf("archive has no %s", need)
		}
	}
	if !seen[crmetadata.CheckpointDirectory] {
		return fmt.Errorf("archive has no %s/ directory", crmetadata.CheckpointDirectory)
	}
	return nil
}

// Top-level members of a checkpoint archive (internal/criu archive.go):
// files, and the directory of CRIU's images.
var archiveFiles = map[string]bool{
	crmetadata.ConfigDumpFile: true, crmetadata.SpecDumpFile: true, crmetadata.StatusDumpFile: true,
	crmetadata.RootFsDiffTar: true, crmetadata.DumpLogFile: true, "container.log": true,
}

// archiveMember checks one header and returns its clean name.
func archiveMember(h *tar.Header) (string, error) {
	raw := h.Name
	name := strings.TrimSuffix(raw, "/")
	if name == "" || strings.ContainsRune(name, 0) || strings.Contains(name, `\`) || !filepath.IsLocal(name) || filepath.Clean(name) != name {
		return "", fmt.Errorf("archive member %q is not a plain relative path", raw)
	}
	top, rest, nested := strings.Cut(name, "/")
	switch h.Typeflag {
	case tar.TypeReg:
		if strings.HasSuffix(raw, "/") {
			return "", fmt.Errorf("archive member %q: a file named as a directory", raw)
		}
		if !nested && archiveFiles[top] {
			return name, nil
		}
		if nested && top == crmetadata.CheckpointDirectory && rest != "" {
			return name, nil
		}
		return "", fmt.Errorf("archive member %q is not part of a checkpoint archive", raw)
	case tar.TypeDir:
		if top != crmetadata.CheckpointDirectory {
			return "", fmt.Errorf("archive directory %q is not part of a checkpoint archive", raw)
		}
		return name, nil
	default:
		return "", fmt.Errorf("archive member %q is of tar type %q: only regular files and directories are accepted", raw, h.Typeflag)
	}
}
