package criucheck

import (
	"encoding/json"
	"io"
	"strings"
)

// maxDescriptorsBytes bounds descriptors.json (three short strings).
const maxDescriptorsBytes = 64 << 10

// checkDescriptors reads runc's descriptors.json, the container's stdio as
// the checkpoint saw it: runc makes every entry naming a pipe an inherited
// fd of CRIU at the entry's index (libcontainer/criu_linux.go, Restore), and
// index 3 on is CRIU's own RPC socket. Exactly the three stdio entries are
// allowed.
func (c *checker) checkDescriptors() error {
	const name = "descriptors.json"
	if !c.has("", name) {
		return nil
	}
	f, size, err := openRegular(c.dir, name)
	if err != nil {
		return refuse(name, "", "%v", err)
	}
	defer f.Close()
	if size > maxDescriptorsBytes {
		return refuse(name, "", "%d bytes; runc writes three short names", size)
	}
	var ds []string
	if err := json.NewDecoder(io.LimitReader(f, maxDescriptorsBytes)).Decode(&ds); err != nil {
		return refuse(name, "", "not a JSON list of names: %v", err)
	}
	if len(ds) > 3 {
		return refuse(name, "", "%d entries; a container has three standard descriptors, and runc gives CRIU entry 3 on as its own", len(ds))
	}
	for i, d := range ds {
		if strings.IndexByte(d, 0) >= 0 || len(d) > 4096 {
			return refuse(name, "["+itoa(i)+"]", "not a descriptor name")
		}
	}
	return nil
}
