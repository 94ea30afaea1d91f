package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	crmetadata "github.com/checkpoint-restore/checkpointctl/lib"
)

// Memory pre-copy (docs/checkpoint.md, "Memory pre-copy"): while the pod
// still runs, CRIU pre-dumps each container's memory and starts the
// kernel's dirty-page tracking; the pause and the final dump then write
// only the pages dirtied since, on top of the pre-dump (CRIU's parent
// image). It shortens the frozen window only when three things hold, all
// decided once at start: the node's configuration allows it, the runtime
// passes a parent image to the final dump (a Tasks that is also a
// ParentCheckpointer), and CRIU and the kernel track dirty pages (asked
// last, and only then). containerd 2.2 does not pass a parent (see
// ContainerdTasks), so on today's stack pre-copy is never used, CRIU is not
// run for it at start, and every checkpoint takes exactly the path it took
// before.

// PreCopy modes (config: checkpoint.pre_copy).
const (
	PreCopyAuto = "auto"
	PreCopyOff  = "off"
)

// PreCopyConfig configures memory pre-copy.
type PreCopyConfig struct {
	// Mode is PreCopyAuto or PreCopyOff; empty is off.
	Mode string
	// DirtyTracking reports whether CRIU and the kernel track dirty pages
	// (MemTrackAvailable); asked once, in New, and only when Mode is auto
	// and the runtime and pre-dumper would let pre-copy be used.
	// nil counts as not available.
	DirtyTracking func() (bool, error)
	// PreDumper pre-dumps a running container; nil disables pre-copy.
	PreDumper PreDumper
}

// PreDumper copies the memory of a running container's processes into an
// image directory and leaves them running, with dirty-page tracking reset so
// that a later dump with this directory as parent writes only what changed.
type PreDumper interface {
	PreDump(ctx context.Context, id, dir string) error
}

// ParentCheckpointer is a Tasks whose capture can build on a pre-dump:
// Checkpoint with parent, the pre-dump's directory relative to imageDir
// (CRIU's --prev-images-dir, runc's --parent-path, both relative). CRIU
// then links imageDir/parent to it and writes only pages dirtied since.
type ParentCheckpointer interface {
	CheckpointWithParent(ctx context.Context, id, imageDir, workDir, parent string) error
}

// PreCopyInfo is the manifest's record of pre-copy for one checkpoint.
type PreCopyInfo struct {
	// Used is true when every container's final dump was taken on top of
	// its pre-dump (the archive then holds preDumpDir and the parent link).
	Used bool `json:"used"`
	// Reason says why pre-copy was not used.
	Reason string `json:"reason,omitempty"`
	// PreDumpSeconds is how long the pre-dumps took (the pod running), when
	// they were made.
	PreDumpSeconds float64 `json:"preDumpSeconds,omitempty"`
}

// Reasons pre-copy is not used, as the manifest and the log give them.
const (
	reasonPreCopyOff      = "off in the configuration (checkpoint.pre_copy)"
	reasonNoDirtyTracking = "kernel has no dirty-page tracking (criu check --feature mem_dirty_track)"
	reasonNoParent        = "the runtime does not pass a parent image to its checkpoint (containerd 2.2: no parent path reaches runc; docs/checkpoint.md); dirty-page tracking not checked"
	reasonNoPreDumper     = "no pre-dumper configured; dirty-page tracking not checked"
)

// preDumpDir is where a container's pre-dump goes, inside its staging
// directory and its archive, next to CRIU's image directory; preDumpParent is
// it relative to that directory. Its name begins with the image directory's:
// containerd's restore unpacks the archive twice, the first time only for
// its metadata, skipping names that begin "checkpoint" (v2.2
// internal/cri/server/container_checkpoint_linux.go, CRImportCheckpoint), so
// the pre-dump's pages are not copied that first time either; the second
// unpack, into the container's directory, puts it next to checkpoint/,
// where CRIU's parent link finds it.
const (
	preDumpDir    = crmetadata.CheckpointDirectory + "-pre-dump"
	preDumpParent = "../" + preDumpDir
)

// preCopyPlan is the start-up decision: whether checkpoints pre-copy, and
// why not.
type preCopyPlan struct {
	use    bool
	reason string
	// tracking is the dirty-tracking check's answer for the log: "yes",
	// "no", "not checked" (ruled out before CRIU was asked: pre-copy off,
	// a runtime that cannot pass a parent, no pre-dumper) or "check failed".
	tracking string
	parent   ParentCheckpointer
}

// planPreCopy decides once whether checkpoints pre-copy. What needs no
// CRIU is decided first: pre-copy off in the configuration, a runtime that
// cannot pass a parent image to its final dump (containerd's Tasks) or no
// pre-dumper rule it out without running CRIU at all (tracking "not
// checked"; `cri-shim doctor` still runs the check on request). Only when
// pre-copy could be used does CRIU's feature check run.
func planPreCopy(cfg PreCopyConfig, tasks Tasks) preCopyPlan {
	if cfg.Mode != PreCopyAuto {
		return preCopyPlan{reason: reasonPreCopyOff, tracking: "not checked"}
	}
	pc, isPC := tasks.(ParentCheckpointer)
	if !isPC {
		return preCopyPlan{reason: reasonNoParent, tracking: "not checked"}
	}
	if cfg.PreDumper == nil {
		return preCopyPlan{reason: reasonNoPreDumper, tracking: "not checked"}
	}
	if cfg.DirtyTracking == nil {
		return preCopyPlan{reason: reasonNoDirtyTracking, tracking: "not checked"}
	}
	ok, err := cfg.DirtyTracking()
	switch {
	case err != nil:
		return preCopyPlan{reason: "the dirty-page tracking check failed: " + err.Error(), tracking: "check failed"}
	case !ok:
		return preCopyPlan{reason: reasonNoDirtyTracking, tracking: "no"}
	}
	return preCopyPlan{use: true, parent: pc, tracking: "yes"}
}

// preDumpAll pre-dumps every target while the pod runs (in parallel, or one
// after the other with the sequential option) into its staging directory.
// A pre-dump cannot be cut short: CRIU holds the processes while it copies,
// and a final dump started meanwhile would fail, so this waits for all of
// them whatever the deadline (the caller checks the time left afterwards).
// On any failure every pre-dump is removed and the reason returned; nothing
// is paused either way.
func (s *Service) preDumpAll(ctx context.Context, out string, targets []target, sequential bool) error {
	errs := make([]error, len(targets))
	one := func(i int) {
		dir := filepath.Join(stageDir(out, targets[i].name), preDumpDir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			errs[i] = err
			return
		}
		errs[i] = s.cfg.PreCopy.PreDumper.PreDump(ctx, targets[i].id, dir)
	}
	if sequential {
		for i := range targets {
			if errs[i] = ctx.Err(); errs[i] == nil {
				one(i)
			}
		}
	} else {
		var wg sync.WaitGroup
		for i := range targets {
			wg.Add(1)
			go func() { defer wg.Done(); one(i) }()
		}
		wg.Wait()
	}
	var failed []error
	for i, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Errorf("pre-dump of container %s (%s): %w", short(targets[i].id), targets[i].name, err))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	// The ordinary capture starts from empty staging directories.
	for _, t := range targets {
		if err := os.RemoveAll(stageDir(out, t.name)); err != nil {
			failed = append(failed, err)
		}
	}
	return errors.Join(failed...)
}
