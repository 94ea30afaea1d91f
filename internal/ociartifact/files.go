package ociartifact

import "golang.org/x/sys/unix"

// renameNoReplace renames src to dst, failing if dst exists (even empty).
func renameNoReplace(src, dst string) error {
	return unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
}
