package criu

// Names and paths inside a pod checkpoint directory, for packages that copy
// one as it is (internal/ociartifact).
const (
	ManifestFile   = manifestFile
	SandboxFile    = sandboxFile
	IncompleteFile = incompleteFile
	// MaxManifestBytes bounds manifest.json (and what a copy reads of it).
	MaxManifestBytes = maxManifestBytes
)

// ArchiveName is where a container's archive lives inside a checkpoint
// directory, relative to it: containers/<name>.tar.
func ArchiveName(container string) string { return archiveName(container) }

// ArchivePath resolves e's archive inside the checkpoint directory dir
// (absolute, symlinks already resolved) under the same rules as a restore: a
// regular file strictly inside dir once every symlink is followed.
func ArchivePath(dir string, e ContainerEntry) (string, error) { return archivePath(dir, e) }
