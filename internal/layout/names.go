package layout

import "fmt"

// Bounds on the member names of a checkpoint archive read from outside:
// each name at most MaxMemberName bytes (a CRIU image's is a few dozen),
// all of them held for the duplicate check at most maxNameBytes, so that
// an archive of many long names cannot grow the reader's heap (a name of
// 256 KiB on each of 4,000 members was 1 GiB).
const (
	MaxMemberName = 4096
	maxNameBytes  = 8 << 20
)

// MemberNames detects a member listed twice with bounded memory.
type MemberNames struct {
	seen  map[string]struct{}
	bytes int
}

// Add records name; an error for a name too long, one seen before, or too
// many bytes of names.
func (m *MemberNames) Add(name string) error {
	if len(name) > MaxMemberName {
		return fmt.Errorf("member name of %d bytes, more than %d", len(name), MaxMemberName)
	}
	if m.seen == nil {
		m.seen = map[string]struct{}{}
	}
	if _, ok := m.seen[name]; ok {
		return fmt.Errorf("entry %.64q appears twice", name)
	}
	if m.bytes += len(name); m.bytes > maxNameBytes {
		return fmt.Errorf("more than %d bytes of member names", maxNameBytes)
	}
	m.seen[name] = struct{}{}
	return nil
}

// Has reports whether name was added.
func (m *MemberNames) Has(name string) bool {
	_, ok := m.seen[name]
	return ok
}

// ObjectDirPrefix begins the name of every checkpoint directory a
// PodCheckpoint object holds (podcheckpoint.DataDir). Such a directory is
// restored only through its object, never by a restore-from name given
// directly.
const ObjectDirPrefix = "pcp-"

// PulledDirPrefix begins the name of every checkpoint directory a restore
// from an image reference pulled: "oci-" and the 64 hex digits of the image
// index's sha256 digest. Such a directory is restored only through its image
// reference (which the registry allow-list judges), and nothing but the
// pull writes there.
const PulledDirPrefix = "oci-"
