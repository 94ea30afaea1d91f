package capture

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	crmetadata "github.com/checkpoint-restore/checkpointctl/lib"

	"github.com/cri-shim/cri-shim/internal/ckptarchive"
	"github.com/cri-shim/cri-shim/internal/layout"
)

// A container's capture happens in two steps. While the pod is paused,
// captureOne has CRIU write the process images and takes the writable-layer
// diff into a staging directory next to the archive, and takes the log's
// length; the memory pages are copied into the archive as CRIU writes them
// (internal/ckptarchive). Once the pod runs again, packageOne finishes the
// archive containerd restores from (the layout of its CRI
// CheckpointContainer: checkpoint/, rootfs-diff.tar, config.dump, spec.dump,
// status.dump, container.log), or writes it whole when nothing was streamed,
// and removes the staging directory. The pod is thus paused only for CRIU and
// the diff (taken side by side), and the images are written once and copied
// once.

func stageDir(out, name string) string { return filepath.Join(out, layout.ContainersDir, "."+name) }

// workDir is CRIU's work directory (its log and statistics) in the staging
// directory.
func workDir(out, name string) string { return filepath.Join(stageDir(out, name), "work") }

// captured is what a capture leaves for packageOne besides the staging
// directory: the archive being streamed, and the container's log held at the
// cut.
type captured struct {
	stream  *ckptarchive.Stream // nil: the archive is written whole after the resume
	log     *os.File            // nil: the container has no log file
	logSize int64               // the log's length at the cut
}

// abandon ends what packageOne will not: the streaming, the open log.
func (c *captured) abandon() {
	if c.stream != nil {
		c.stream.Abandon()
	}
	if c.log != nil {
		_ = c.log.Close()
	}
}

// captureOne captures one paused container into its staging directory. Unless the
// service writes archives after the resume, the container's archive is
// begun at once and its memory pages copied into it as CRIU writes them
// (internal/ckptarchive). What it returns, packageOne finishes; on error it
// leaves nothing open.
// The time each step took goes into tm.
func (s *Service) captureOne(ctx context.Context, out string, t target, tm *layout.CaptureTimes) (*captured, error) {
	stage := stageDir(out, t.name)
	images := filepath.Join(stage, crmetadata.CheckpointDirectory)
	work := workDir(out, t.name)
	for _, d := range []string{images, work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	c := &captured{}
	if s.cfg.StreamDuringCapture {
		var err error
		if c.stream, err = ckptarchive.StartStream(filepath.Join(out, layout.ArchiveName(t.name)), images); err != nil {
			// Only a loss of overlap: packageOne writes the archive whole.
			s.log.Warn("checkpoint: archive not streamed; written after the resume", "container", short(t.id), "err", err)
			c.stream = nil
		}
	}
	fail := func(err error) (*captured, error) {
		c.abandon()
		return nil, err
	}
	// The writable layer's diff is taken beside CRIU's capture: the pod is
	// paused throughout, and CRIU writes nothing into the container's root
	// filesystem (runc asks it for link remaps only with --link-remap,
	// which containerd does not pass: runc libcontainer/criu_linux.go), so
	// the diff sees the layer as it is at the cut.
	f, err := os.OpenFile(filepath.Join(stage, crmetadata.RootFsDiffTar), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fail(err)
	}
	diffCtx, stopDiff := context.WithCancel(ctx)
	defer stopDiff()
	diffed := make(chan error, 1)
	go func() {
		t0 := s.now()
		bw := bufio.NewWriterSize(f, 1<<20)
		err := s.tasks.RWDiff(diffCtx, t.id, bw)
		if err == nil {
			err = bw.Flush()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		tm.DiffSeconds = s.now().Sub(t0).Seconds()
		diffed <- err
	}()
	t0 := s.now()
	err = s.tasks.Checkpoint(ctx, t.id, images, work)
	tm.CheckpointSeconds = s.now().Sub(t0).Seconds()
	if err != nil {
		stopDiff()
		<-diffed
		return fail(err)
	}
	if c.stream != nil {
		c.stream.ImagesFinal() // runc has returned: CRIU has ended and closed every image
	}
	if err := <-diffed; err != nil {
		return fail(err)
	}
	// The log up to the cut: the restored container continues it from
	// exactly there. Only its length is taken while the container is
	// paused; the bytes are copied after the resume from the file opened
	// now. containerd only appends to a container's log, and the kubelet's
	// rotation renames it and has containerd reopen a new one, leaving this
	// file as it was (docs/checkpoint.md, "The container's log").
	if lp := t.status.GetLogPath(); lp != "" {
		lf, err := os.Open(lp)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fail(fmt.Errorf("container log: %w", err))
		}
		if err == nil {
			c.log = lf
			fi, err := lf.Stat()
			if err != nil {
				return fail(fmt.Errorf("container log: %w", err))
			}
			c.logSize = fi.Size()
		}
	}
	return c, nil
}

// packageOne writes out/containers/<name>.tar from the staging directory and
// returns its size. imageID is the ID of the container's image ("" if the
// runtime did not tell it). c is what the capture left: a stream that has
// already copied the memory pages into the archive (the rest is written after
// them), and the log held at the cut. packageOne closes both.
func (s *Service) packageOne(ctx context.Context, out string, t target, imageID string, checkpointedAt time.Time, c *captured) (int64, error) {
	if c.log != nil {
		defer c.log.Close()
	}
	path := filepath.Join(out, layout.ArchiveName(t.name))
	var (
		f        *os.File
		streamed map[string]bool
		err      error
	)
	if c.stream != nil {
		if f, streamed, err = c.stream.Finish(); f == nil {
			return 0, err
		} else if err != nil {
			s.log.Warn("checkpoint: streaming the archive failed; writing it after the capture", "container", short(t.id), "err", err)
		}
	} else if f, streamed, err = ckptarchive.WriteComplete(path, filepath.Join(stageDir(out, t.name), crmetadata.CheckpointDirectory)); err != nil {
		// Only a loss of speed: the archive is written whole below.
		s.log.Warn("checkpoint: copying the memory pages in the kernel failed; writing the archive whole", "container", short(t.id), "err", err)
		if f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
			return 0, err
		}
	}
	stage := stageDir(out, t.name)
	st := t.status
	config, err := json.Marshal(&crmetadata.ContainerConfig{
		ID: t.id, Name: t.name,
		RootfsImageName: st.GetImage().GetImage(), RootfsImageRef: layout.RootfsImageRef(imageID, st.GetImageRef()), RootfsImage: st.GetImage().GetImage(),
		OCIRuntime: t.info.Runtime, CheckpointedAt: checkpointedAt, CreatedTime: t.info.Created,
	})
	if err != nil {
		f.Close()
		return 0, err
	}
	// containerd reads status.dump with encoding/json into the CRI type.
	statusJSON, err := json.Marshal(st)
	if err != nil {
		f.Close()
		return 0, err
	}
	err = ckptarchive.WriteRest(ctx, f, ckptarchive.Rest{
		Dumps: []ckptarchive.Member{
			{Name: crmetadata.ConfigDumpFile, Data: config},
			{Name: crmetadata.SpecDumpFile, Data: t.info.Spec},
			{Name: crmetadata.StatusDumpFile, Data: statusJSON},
		},
		Log: c.log, LogSize: c.logSize, Stage: stage, Streamed: streamed, ModTime: checkpointedAt,
	})
	// The staging copy goes before the fsync: its pages, if still dirty,
	// are then dropped rather than written back.
	if err == nil {
		err = os.RemoveAll(stage)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
