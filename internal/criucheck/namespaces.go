package criucheck

import (
	"strconv"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/netdev"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pidns"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// The keys runc gives CRIU for a network or PID namespace the spec names by
// path (libcontainer/criu_linux.go, criuNsToKey): CRIU restores into the
// inherited namespace only where the namespace's image names that key
// (criu/net.c, prepare_net_namespaces; criu/cr-restore.c).
const (
	extNetKey = "extRootNetNS"
	extPidKey = "extRootPidNS"
)

// checkExternalNS reads the root task's network and PID namespace images:
// a namespace the spec gives by path must be the runtime's (its key), one
// the spec creates must not claim a key. A new network namespace would be
// configured from netdev, route and iptables images, which no pod
// checkpoint has and which are refused as unknown files.
func (c *checker) checkExternalNS() error {
	paths := map[specs.LinuxNamespaceType]string{}
	if c.p.spec.Linux != nil {
		for _, n := range c.p.spec.Linux.Namespaces {
			paths[n.Type] = n.Path
		}
	}
	if err := c.checkExtKey("netns", c.root[1], func(dir, name string) (string, error) {
		var e netdev.NetnsEntry
		err := oneEntry(dir, name, "NETNS", &e)
		return e.GetExtKey(), err
	}, paths, specs.NetworkNamespace, extNetKey); err != nil {
		return err
	}
	return c.checkExtKey("pidns", c.root[0], func(dir, name string) (string, error) {
		var e pidns.PidnsEntry
		err := oneEntry(dir, name, "PIDNS", &e)
		return e.GetExtKey(), err
	}, paths, specs.PIDNamespace, extPidKey)
}

func (c *checker) checkExtKey(kind string, id uint32, read func(dir, name string) (string, error),
	paths map[specs.LinuxNamespaceType]string, t specs.LinuxNamespaceType, want string) error {
	for _, name := range c.files[kind] {
		if name != kind+"-"+strconv.FormatUint(uint64(id), 10)+".img" {
			return refuse(name, "", "a %s namespace no task of the tree is in", t)
		}
	}
	name := kind + "-" + strconv.FormatUint(uint64(id), 10) + ".img"
	path, inSpec := paths[t]
	if !c.has(kind, name) {
		if inSpec && path != "" {
			return refuse(name, "", "missing: the container joins the runtime's %s namespace, and nothing says the restore should", t)
		}
		return nil
	}
	key, err := read(c.dir, name)
	if err != nil {
		return asRefusal(name, err)
	}
	switch {
	case path != "" && key != want:
		return refuse(name, "ext_key", "%q; the container's %s namespace is the runtime's (%s)", key, t, want)
	case path == "" && key != "":
		return refuse(name, "ext_key", "%q; the container's %s namespace is a new one", key, t)
	}
	return nil
}
