// Package criucheck decides whether a checkpoint's CRIU images may be
// restored into a container: nothing the images would give the restored
// processes may exceed what the container's OCI runtime spec allows.
//
// CRIU restores a process tree as root and applies what its images say:
// credentials and capability sets (criu/cr-restore.c, prepare_creds and the
// restorer's restore_creds), seccomp filters (criu/seccomp.c), namespaces,
// mounts, open files. runc restore does not apply the spec's process
// attributes on top (libcontainer/criu_linux.go, Restore: the spec reaches
// CRIU only as namespaces, external mounts and cgroups). So a checkpoint whose
// images were edited (they are bytes anyone who can push to an allowed
// registry can write) would otherwise run with whatever privileges it names.
// Check compares the images with the spec the runtime made from the pod's own
// CreateContainer config and refuses, naming the first offending field.
//
// Every image is decoded with go-criu's generated types, entry by entry, with
// bounded sizes (decode.go); every populated field must have a rule
// (fields.go); unknown image files are refused.
package criucheck

import (
	"fmt"
	"os"
	"regexp"
	"strconv"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// Refusal is a checkpoint the spec does not allow: Image is the image file,
// Field the first offending field, Reason what is wrong with it.
type Refusal struct {
	Image  string
	Field  string
	Reason string
}

// Error says which image and field were refused, and why.
func (r *Refusal) Error() string {
	if r.Field == "" {
		return fmt.Sprintf("checkpoint refused: %s: %s", r.Image, r.Reason)
	}
	return fmt.Sprintf("checkpoint refused: %s: %s: %s", r.Image, r.Field, r.Reason)
}

func refuse(image, field, format string, args ...any) *Refusal {
	return &Refusal{Image: image, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// maxImageFiles bounds the files of an images directory.
const maxImageFiles = 100000

// imageKinds are the image files a runc checkpoint of a container has, and
// what checks each (criu/include/image-desc.h names them). A file matching
// none is refused: its content would be restored unchecked.
var imageKinds = []struct {
	re    *regexp.Regexp
	check string // the check that covers it; "" for one not decoded (fields.go, imageClasses says why)
}{
	{regexp.MustCompile(`^inventory\.img$`), "inventory"},
	{regexp.MustCompile(`^pstree\.img$`), "pstree"},
	{regexp.MustCompile(`^core-[0-9]+\.img$`), "core"},
	{regexp.MustCompile(`^ids-[0-9]+\.img$`), "ids"},
	{regexp.MustCompile(`^seccomp\.img$`), "seccomp"},
	{regexp.MustCompile(`^netns-[0-9]+\.img$`), "netns"},
	{regexp.MustCompile(`^pidns-[0-9]+\.img$`), "pidns"},
	{regexp.MustCompile(`^files\.img$`), "files"},
	{regexp.MustCompile(`^fdinfo-[0-9]+\.img$`), "fdinfo"},
	{regexp.MustCompile(`^mountpoints-[0-9]+\.img$`), "mounts"},
	{regexp.MustCompile(`^ghost-file-[0-9a-f]+\.img$`), "ghost"},
	{regexp.MustCompile(`^tmpfs-dev-[0-9]+\.tar\.gz\.img$`), "tmpfs"},
	// Memory: the pages and where they go; a mapping of a file names the
	// file by an ID of files.img, checked there.
	{regexp.MustCompile(`^mm-[0-9]+\.img$`), "mm"},
	{regexp.MustCompile(`^pagemap-[0-9]+\.img$`), ""},
	{regexp.MustCompile(`^pages-[0-9]+\.img$`), ""},
	{regexp.MustCompile(`^fs-[0-9]+\.img$`), "fs"},
	{regexp.MustCompile(`^remap-fpath\.img$`), "remap"},
	// Data of pipes, FIFOs, sockets and terminals files.img declares:
	// entries decoded and checked (fieldchecks.go), the data skipped.
	{regexp.MustCompile(`^tty-info\.img$`), "tty"},
	{regexp.MustCompile(`^(pipes-data|fifo-data)\.img$`), "pipedata"},
	{regexp.MustCompile(`^sk-queues\.img$`), "skqueues"},
	{regexp.MustCompile(`^tty-data\.img$`), "ttydata"},
	{regexp.MustCompile(`^utsns-[0-9]+\.img$`), "uts"},
	{regexp.MustCompile(`^ipcns-var-[0-9]+\.img$`), "ipcvar"},
	{regexp.MustCompile(`^(ipcns-shm|ipcns-msg|ipcns-sem|ipcns-shm-pages)-[0-9]+\.img$`), "ipcobj"},
	{regexp.MustCompile(`^timens-[0-9]+\.img$`), "timens"},
	{regexp.MustCompile(`^tcp-stream-[0-9a-f]+\.img$`), "tcpstream"},
	{regexp.MustCompile(`^cgroup\.img$`), "cgroup"},
	{regexp.MustCompile(`^(stats-dump|stats-restore|irmap-cache)\.img$`), ""},
	{regexp.MustCompile(`^(memfd|memfd-inode)\.img$`), "memfd"},
	{regexp.MustCompile(`^timerfd\.img$`), "timerfd"},
	{regexp.MustCompile(`^rseq\.img$`), ""},
	// runc's own records beside CRIU's (libcontainer/criu_linux.go).
	{regexp.MustCompile(`^descriptors\.json$`), ""},
	{regexp.MustCompile(`^(dump\.log|restore\.log)$`), ""},
}

// Options tune a check.
type Options struct {
	// HardLimits gives the hard limit a container process inherits for
	// an RLIMIT_* resource the spec does not set (OwnHardLimits in the
	// runtime shim, whose limits runc passes on); nil skips the resource
	// limits the spec does not set.
	HardLimits func(resource int) (uint64, bool)
}

// Check refuses the images in dir unless the container of spec may run them.
// A *Refusal says why; another error is an unreadable directory.
func Check(dir string, spec *specs.Spec, opts Options) error {
	if spec == nil || spec.Process == nil {
		return fmt.Errorf("the container's runtime spec has no process")
	}
	p := policyOf(spec)
	// runc passes this annotation to CRIU as its configuration file
	// (libcontainer/criu_linux.go), which can name a script CRIU runs.
	if _, ok := spec.Annotations["org.criu.config"]; ok {
		return refuse("config.json", "annotations", "org.criu.config would configure the restore")
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(maxImageFiles + 1)
	d.Close()
	if err != nil {
		return fmt.Errorf("reading the images directory: %w", err)
	}
	if len(names) > maxImageFiles {
		return refuse(dir, "", "more than %d image files", maxImageFiles)
	}
	c := &checker{dir: dir, p: p, opts: opts, files: map[string][]string{}}
	for _, n := range names {
		kind, ok := kindOf(n)
		if !ok {
			return refuse(n, "", "not an image file of a container checkpoint; it would be restored unchecked")
		}
		c.files[kind] = append(c.files[kind], n)
	}
	return c.run()
}

// KindOf names the check an image file belongs to ("core", "mounts",
// "files"...; "memory" for contents that are not decoded, "unknown" for a
// file no container checkpoint has), for metrics.
func KindOf(name string) string {
	k, ok := kindOf(name)
	switch {
	case !ok:
		return "unknown"
	case k == "":
		return "memory"
	}
	return k
}

func kindOf(name string) (string, bool) {
	for _, k := range imageKinds {
		if k.re.MatchString(name) {
			return k.check, true
		}
	}
	return "", false
}

// checker holds what one Check has read so far.
type checker struct {
	dir     string
	p       *policy
	opts    Options
	files   map[string][]string // by check kind
	root    nsIDs               // the root task's namespaces
	criuIDs nsIDs               // CRIU's own namespaces (inventory root_ids)
	// cgroupTops are the container's cgroup directories (cgroup.img), as
	// the root a cgroup mount shows.
	cgroupTops map[string]bool
	// pids are the processes of the tree.
	pids map[uint32]bool
	// fileIDs are the IDs of files.img's entries.
	fileIDs map[uint32]bool
	// seccompUsed: the filter indexes threads start their chains at.
	seccompUsed map[uint32]bool
}

func (c *checker) run() error {
	for _, step := range []func() error{
		c.checkInventory,
		c.checkTree,
		c.checkExternalNS,
		c.checkNSImages,
		c.checkSeccomp,
		c.checkFiles,
		c.checkTaskFiles,
		c.checkMemory,
		c.checkCgroup,
		c.checkDescriptors,
		c.checkMounts,
		c.checkGhosts,
		c.checkTmpfs,
		c.checkFieldRules,
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

func pidImage(kind string, pid uint32) string {
	return kind + "-" + itoa(pid) + ".img"
}

func itoa[T int | uint32](v T) string { return strconv.FormatInt(int64(v), 10) }
