package ociartifact

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	crmetadata "github.com/checkpoint-restore/checkpointctl/lib"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// checkArchive reads a container checkpoint archive to its end and checks
// that it is one internal/capture writes (the layout of containerd's CRI
// checkpoint archive): only regular files and directories, every name a
// local path under a member criu writes, no name twice, and the members a
// restore reads all present. containerd unpacks the archive on restore; this
// keeps a pulled archive to what it would unpack from a checkpoint made here.
// Its config.dump must name the base image by image ID (checkBaseImage).
func checkArchive(r io.Reader) error {
	tr := tar.NewReader(r)
	var seen layout.MemberNames
	n := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, tar.ErrHeader) {
				return refused(fmt.Errorf("archive: %w", err))
			}
			return fmt.Errorf("archive: %w", err) // the registry's stream
		}
		if n++; n > maxArchiveEntries {
			return refused(fmt.Errorf("archive has more than %d entries", maxArchiveEntries))
		}
		name, err := archiveMember(h)
		if err != nil {
			return refused(err)
		}
		if err := seen.Add(name); err != nil {
			return refused(fmt.Errorf("archive: %w", err))
		}
		if name == crmetadata.ConfigDumpFile {
			if err := checkBaseImage(tr); err != nil {
				return err
			}
		}
	}
	for _, need := range []string{crmetadata.ConfigDumpFile, crmetadata.SpecDumpFile, crmetadata.StatusDumpFile, crmetadata.RootFsDiffTar} {
		if !seen.Has(need) {
			return refused(fmt.Errorf("archive has no %s", need))
		}
	}
	if !seen.Has(crmetadata.CheckpointDirectory) {
		return refused(fmt.Errorf("archive has no %s/ directory", crmetadata.CheckpointDirectory))
	}
	return nil
}

// maxConfigDump bounds the config.dump read (criu writes a few hundred bytes).
const maxConfigDump = 64 << 10

// checkBaseImage reads config.dump and requires its rootfsImageRef to be an
// image ID (criu.RootfsImageRef): containerd's restore pulls a base image it
// lacks by that name (containerd v2.2 container_checkpoint_linux.go,
// CRImportCheckpoint), so a repository reference in a pulled archive would
// make the node's containerd connect to whatever registry the archive
// names. An ID names no host: a node without the image fails the restore,
// and the kubelet has pulled the pod's image, which the warm start checks is
// the checkpointed one, before it asks for the container.
func checkBaseImage(r io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(r, maxConfigDump+1))
	if err != nil {
		return fmt.Errorf("archive: %s: %w", crmetadata.ConfigDumpFile, err) // the registry's stream
	}
	if len(b) > maxConfigDump {
		return refused(fmt.Errorf("archive: %s is larger than %d bytes", crmetadata.ConfigDumpFile, maxConfigDump))
	}
	var c crmetadata.ContainerConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return refused(fmt.Errorf("archive: %s: %w", crmetadata.ConfigDumpFile, err))
	}
	if !layout.IsImageID(c.RootfsImageRef) {
		return refusedf("archive: %s names the base image %q, not by image ID (sha256:<64 hex>); containerd would pull it from the registry it names",
			crmetadata.ConfigDumpFile, c.RootfsImageRef)
	}
	return nil
}

// Top-level members of a checkpoint archive (internal/capture archive.go):
// files, and the directory of CRIU's images.
var archiveFiles = map[string]bool{
	crmetadata.ConfigDumpFile: true, crmetadata.SpecDumpFile: true, crmetadata.StatusDumpFile: true,
	crmetadata.RootFsDiffTar: true, crmetadata.DumpLogFile: true, "container.log": true,
}

// archiveMember checks one header and returns its clean name.
func archiveMember(h *tar.Header) (string, error) {
	raw := h.Name
	if len(raw) > layout.MaxMemberName {
		return "", fmt.Errorf("archive member %q...: a name of %d bytes, more than %d", raw[:64], len(raw), layout.MaxMemberName)
	}
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
