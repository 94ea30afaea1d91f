// Package runtimeshim is the task service of cri-shim's containerd runtime
// shim: containerd's own runc shim (its task service, unchanged) with one
// addition: the task of a container that cri-shim marked for a restore
// (internal/restoremark) is created as a restore from the staged CRIU images,
// with the checkpoint's rootfs changes applied to the new container's rootfs
// first, and only when the images and the changes are within the bundle's
// spec (checked again here, then the files the images hold open against that
// rootfs; package criucheck). A restore without a mark is refused: this shim
// restores only what cri-shim staged and checked. Everything else about the container (image, mounts, env, devices,
// security context) is the OCI spec containerd's CRI made from the pod's own
// CreateContainer config; nothing in the checkpoint archive reaches it.
//
// containerd's runc shim already restores when CreateTaskRequest.Checkpoint
// names an images directory: its init process waits in the
// createdCheckpointState and runs `runc restore` on Start
// (cmd/containerd-shim-runc-v2/process/init.go, createCheckpointedState;
// init_state.go, createdCheckpointState.Start). The CRI's StartContainer
// (NewTask, then Start) therefore restores such a task without knowing it.
package runtimeshim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cri-shim/cri-shim/internal/criucheck"
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

// Service is the runc shim's task service with restores of marked containers.
type Service struct {
	taskAPI.TTRPCTaskService
	marks restoremark.Dir
	// restoring holds the tasks created as a restore whose Start (where
	// runc restores them) has not run, for the log of its duration.
	restoring sync.Map // task ID -> pendingRestore
}

// pendingRestore is what Start checks again of a task created as a restore.
type pendingRestore struct {
	images, rootfs string
	spec           *specs.Spec
}

// New wraps inner, the runc shim's task service, reading marks from marks.
func New(inner taskAPI.TTRPCTaskService, marks restoremark.Dir) *Service {
	return &Service{TTRPCTaskService: inner, marks: marks}
}

// RegisterTTRPC serves the wrapped service.
func (s *Service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, s)
	return nil
}

// Create creates the task; for a marked container, as a restore. A mark that
// is there but cannot be used fails the create: a container meant to resume
// from its checkpoint must not start fresh instead.
func (s *Service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	m, err := s.marks.Claim(r.ID)
	if err != nil {
		return nil, errgrpc.ToGRPC(fmt.Errorf("cri-shim restore: %v: %w", err, errdefs.ErrFailedPrecondition))
	}
	if m == nil {
		if r.Checkpoint != "" {
			// A restore cri-shim did not stage (containerd's own: its
			// CRI's import of a checkpoint archive or image) would hand
			// runc images and a rootfs diff nobody checked.
			log.G(ctx).WithField("id", r.ID).WithField("checkpoint", r.Checkpoint).Warn("cri-shim: refused a restore without cri-shim's mark")
			return nil, errgrpc.ToGRPC(fmt.Errorf("cri-shim's runtime shim restores only checkpoints cri-shim staged and checked; a restore from %q without its mark is refused: %w", r.Checkpoint, errdefs.ErrFailedPrecondition))
		}
		return s.TTRPCTaskService.Create(ctx, r)
	}
	if r.Checkpoint != "" {
		return nil, errgrpc.ToGRPC(fmt.Errorf("cri-shim restore of %s: containerd asked for a restore from %q too: %w", r.ID, r.Checkpoint, errdefs.ErrInvalidArgument))
	}
	if m.RootfsDiff != "" && len(r.Rootfs) == 0 {
		return nil, errgrpc.ToGRPC(fmt.Errorf("cri-shim restore of %s: the checkpoint has rootfs changes and the task has no rootfs mounts to apply them to: %w", r.ID, errdefs.ErrFailedPrecondition))
	}
	// cri-shim checked the images and the rootfs diff against this
	// container's spec before it left the mark; they are checked again
	// against the spec runc will run (the bundle's), before anything is
	// created or applied, so that nothing but a checked checkpoint is
	// restored whatever wrote the mark.
	t0 := time.Now()
	diffMax := restoremark.RootfsDiffLimit(m.RootfsDiffMaxBytes)
	spec, err := readSpec(r.Bundle)
	if err == nil {
		err = criucheck.Check(m.Images, spec, criucheck.Options{HardLimits: criucheck.OwnHardLimits})
	}
	if err == nil && m.RootfsDiff != "" {
		err = criucheck.CheckRootfsDiff(m.RootfsDiff, spec, diffMax)
	}
	if err != nil {
		s.noteRefusal(ctx, r.ID, err)
		return nil, errgrpc.ToGRPC(fmt.Errorf("cri-shim restore of %s: %v: %w", r.ID, err, errdefs.ErrFailedPrecondition))
	}
	checked := time.Now()
	r.Checkpoint = m.Images
	resp, err := s.TTRPCTaskService.Create(ctx, r)
	if err != nil {
		return nil, err
	}
	created := time.Now()
	l := log.G(ctx).WithField("id", r.ID).WithField("images", m.Images).WithField("check", checked.Sub(t0)).WithField("create", created.Sub(checked))
	fail := func(what string, err error) (*taskAPI.CreateTaskResponse, error) {
		if _, derr := s.TTRPCTaskService.Delete(ctx, &taskAPI.DeleteRequest{ID: r.ID}); derr != nil {
			log.G(ctx).WithError(derr).WithField("id", r.ID).Warn("cri-shim: deleting the task whose restore was refused")
		}
		return nil, errgrpc.ToGRPC(fmt.Errorf("cri-shim restore of %s: %s%v: %w", r.ID, what, err, errdefs.ErrFailedPrecondition))
	}
	// The runc shim mounted the rootfs at <bundle>/rootfs in Create
	// (cmd/containerd-shim-runc-v2/runc/container.go, NewContainer); the
	// restore happens at Start, so the changes go in between, as
	// containerd's own restore did (core/runtime/v2/shim.go, shimTask.Create).
	if err := checkRunc(ctx, r.Bundle); err != nil {
		return fail("", err)
	}
	rootfs := filepath.Join(r.Bundle, "rootfs")
	if m.RootfsDiff != "" {
		if err := applyDiff(ctx, rootfs, m.RootfsDiff, spec, diffMax); err != nil {
			s.noteRefusal(ctx, r.ID, err)
			return fail("applying the checkpoint's rootfs changes: ", err)
		}
		l = l.WithField("rootfsDiff", time.Since(created))
	}
	// Only now is the file system the restore opens files in complete:
	// the files the images hold open must be ones the container's user
	// could open itself (CRIU opens them as root).
	t1 := time.Now()
	if err := criucheck.CheckAccess(m.Images, spec, rootfs); err != nil {
		s.noteRefusal(ctx, r.ID, err)
		return fail("", err)
	}
	s.restoring.Store(r.ID, pendingRestore{images: m.Images, rootfs: rootfs, spec: spec})
	l.WithField("access", time.Since(t1)).Info("cri-shim: task created as a restore")
	return resp, nil
}

// Start starts the task; runc restores a task created as a restore here,
// and the time it took is logged.
func (s *Service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	if r.ExecID != "" {
		return s.TTRPCTaskService.Start(ctx, r)
	}
	v, restore := s.restoring.LoadAndDelete(r.ID)
	if !restore {
		return s.TTRPCTaskService.Start(ctx, r)
	}
	// CRIU opens the images' files now, not at create: a file of a volume
	// the pod shares could have been swapped since (for a link to a file
	// its user cannot open), so the paths and access are checked again,
	// as close to runc's restore as this shim gets. A refusal leaves the
	// task unstarted; containerd's CRI deletes a task whose start failed.
	p := v.(pendingRestore)
	if err := criucheck.CheckAccess(p.images, p.spec, p.rootfs); err != nil {
		s.noteRefusal(ctx, r.ID, err)
		return nil, errgrpc.ToGRPC(fmt.Errorf("cri-shim restore of %s: %v: %w", r.ID, err, errdefs.ErrFailedPrecondition))
	}
	t0 := time.Now()
	resp, err := s.TTRPCTaskService.Start(ctx, r)
	log.G(ctx).WithField("id", r.ID).WithField("restore", time.Since(t0)).WithField("ok", err == nil).Info("cri-shim: task restored by runc")
	return resp, err
}

// maxSpecBytes bounds the bundle's config.json read.
const maxSpecBytes = 16 << 20

// readSpec reads the bundle's spec, the one runc will run.
func readSpec(bundle string) (*specs.Spec, error) {
	f, err := os.Open(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("reading the container's spec: %w", err)
	}
	defer f.Close()
	var spec specs.Spec
	if err := json.NewDecoder(io.LimitReader(f, maxSpecBytes)).Decode(&spec); err != nil {
		return nil, fmt.Errorf("the container's spec: %w", err)
	}
	return &spec, nil
}

// applyDiff applies a layer tar to rootfs with containerd's archive.Apply,
// the applier of image layers: it keeps every entry inside rootfs (symlinks
// included) and honours OCI whiteouts. The diff was checked already; each
// header is decided again by the same rules as it is applied, and the
// expanded stream bounded again by maxBytes (criucheck.RootfsDiff), so the
// file read here is held to them even if it changed since. Only here, with
// the rootfs mounted and the entries before it applied, is each entry also
// held to what the container's user could have written there
// (RootfsDiff.ApplyFilter): the applier writes as root.
func applyDiff(ctx context.Context, rootfs, diff string, spec *specs.Spec, maxBytes int64) error {
	d, err := criucheck.OpenRootfsDiff(diff, spec, maxBytes)
	if err != nil {
		return err
	}
	defer d.Close()
	_, err = archive.Apply(ctx, rootfs, d, archive.WithFilter(d.ApplyFilter(rootfs)))
	return err
}

// Delete deletes the task, and forgets it if it was never started.
func (s *Service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	if r.ExecID == "" {
		s.restoring.Delete(r.ID)
	}
	return s.TTRPCTaskService.Delete(ctx, r)
}

// noteRefusal leaves, beside container id's claimed mark, the refusal err
// is (when it is one: not an I/O error), for cri-shim (restoremark.Refuse).
func (s *Service) noteRefusal(ctx context.Context, id string, err error) {
	var r *criucheck.Refusal
	if !errors.As(err, &r) {
		return
	}
	if werr := s.marks.Refuse(id, restoremark.Refusal{Image: r.Image, Field: r.Field, Reason: r.Reason}); werr != nil {
		log.G(ctx).WithError(werr).WithField("id", id).Warn("cri-shim: recording a refused restore for cri-shim")
	}
}
