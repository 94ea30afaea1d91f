package layout

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// ErrOutsideRoot marks a path refused by confinement (KEP-5823 "Path traversal
// protection"); callers answer it with InvalidArgument.
var ErrOutsideRoot = errors.New("outside the checkpoint root")

// Confine resolves p and checks that it lies strictly inside root once every
// symlink is followed. p must be absolute and must not contain ".." elements
// (even ones that would stay inside the root: a caller that writes them is
// confused or probing). The resolved path is returned; callers use it from
// then on so that a symlink swapped in later is not followed.
func Confine(root, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("path is empty")
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("path %q is not absolute", p)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path %q contains a NUL byte", p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", fmt.Errorf("path %q contains \"..\": %w", p, ErrOutsideRoot)
		}
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", fmt.Errorf("checkpoint root %s: %w", root, err)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			// Still refuse an escape before saying it is missing, so that a
			// probe cannot learn what exists outside the root.
			if !Within(realRoot, filepath.Clean(p)) {
				return "", fmt.Errorf("path %q is %w %s", p, ErrOutsideRoot, root)
			}
			return "", fmt.Errorf("path %q does not exist: %w", p, os.ErrNotExist)
		}
		return "", fmt.Errorf("path %q: %w", p, err)
	}
	if !Within(realRoot, real) {
		if real != filepath.Clean(p) {
			return "", fmt.Errorf("path %q resolves to %q, %w %s", p, real, ErrOutsideRoot, root)
		}
		return "", fmt.Errorf("path %q is %w %s", p, ErrOutsideRoot, root)
	}
	return real, nil
}

// Within reports whether p is strictly below root (both clean and absolute).
func Within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && rel != "." && filepath.IsLocal(rel)
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// CheckName validates a checkpoint's directory name under the root, as used by
// the restore-from annotation and the CLI: one path element, no dot-only names.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("checkpoint name %q must be 1-253 characters of letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// ArchivePath is the path of a container's archive inside the checkpoint
// directory dir (already confined and resolved), checked when it is about to
// be used: it must resolve, after every symlink, to a regular file strictly
// inside dir. A manifest is not trusted to name paths, and an archive that is
// a symlink to a file elsewhere is refused like a "../" name.
func ArchivePath(dir string, e ContainerEntry) (string, error) {
	// Not filepath.Join, which would clean "../" away before confine sees it.
	p, err := Confine(dir, dir+"/"+e.Archive)
	if err != nil {
		if errors.Is(err, ErrOutsideRoot) {
			return "", fmt.Errorf("archive %s is not inside the checkpoint directory once symlinks are followed: %w", e.Archive, err)
		}
		return "", fmt.Errorf("archive: %w", err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("archive: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("archive %s is not a regular file (%s)", e.Archive, fi.Mode().Type())
	}
	return p, nil
}
