package main

// cri-shim checkpoint push / pull: a pod checkpoint to and from an OCI
// registry (internal/ociartifact, docs/checkpoint-oci.md).

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/ociartifact"
	"github.com/cri-shim/cri-shim/internal/podspec"
)

// registryFlags are the flags of every command that talks to a registry.
type registryFlags struct {
	config, caFile string
	plainHTTP      bool
	timeout        time.Duration
}

func (f *registryFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.config, "registry-config", "", "docker config.json with the registry's credentials (default: $DOCKER_CONFIG or ~/.docker/config.json)")
	cmd.Flags().StringVar(&f.caFile, "ca-file", "", "PEM bundle trusted for the registry's TLS in addition to the system roots")
	cmd.Flags().BoolVar(&f.plainHTTP, "plain-http", false, "talk plain HTTP to the registry, never HTTPS (a loopback registry only)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 30*time.Minute, "deadline of the whole transfer")
}

func (f *registryFlags) registry() ociartifact.Registry {
	return ociartifact.Registry{Config: f.config, CAFile: f.caFile, PlainHTTP: f.plainHTTP}
}

// transferResult is the -o json|yaml form of push and pull.
type transferResult struct {
	Name       string   `json:"name"`
	Dir        string   `json:"dir"`
	Ref        string   `json:"ref"`
	Digest     string   `json:"digest"`
	Bytes      int64    `json:"bytes"`
	Containers []string `json:"containers"`
	Seconds    float64  `json:"seconds"`
}

func containerNames(m *layout.Manifest) []string {
	names := []string{}
	for _, c := range m.Containers {
		names = append(names, c.Name)
	}
	return names
}

// progressOut is where progress goes: stdout for the table output, stderr
// when stdout carries json or yaml.
func progressOut(cmd *cobra.Command, format string) io.Writer {
	if format == "table" {
		return cmd.OutOrStdout()
	}
	return cmd.ErrOrStderr()
}

func newCheckpointPushCmd() *cobra.Command {
	var path, format string
	var rf registryFlags
	cmd := &cobra.Command{
		Use:   "push NAME|DIR REF",
		Short: "Push a pod checkpoint to an OCI registry",
		Long: `Push a pod checkpoint to an OCI registry as an image index: one checkpoint
image per container (the format CRI-O, checkpointctl and containerd's CRI
restore read) and the pod's manifest (docs/checkpoint-oci.md). NAME is a
checkpoint under checkpoint.root; an argument with a '/' is a directory.
Blobs the registry already holds are not uploaded again. Prints the pushed
digest. Works while the shim is stopped.`,
		Example: "  cri-shim checkpoint push default-web-20260101T000000Z registry.example.com/checkpoints/web:v1\n" +
			"  cri-shim checkpoint push /var/lib/cri-shim/checkpoints/pcp-1234 localhost:5000/web:v1 --plain-http -o json",
		Args: cobra.ExactArgs(2),
	}
	configFlag(cmd.Flags(), &path, config.DefaultPath, defaultConfigUsage)
	outputFlag(cmd, &format)
	rf.add(cmd)
	cmd.RunE = runE(func(cmd *cobra.Command, args []string) error {
		cfg, err := listingConfig(cmd, path, format, true)
		if err != nil {
			return err
		}
		src, name := args[0], args[0]
		if strings.Contains(src, "/") {
			name = filepath.Base(filepath.Clean(src))
		} else {
			if err := layout.CheckName(src); err != nil {
				return exitError{2, err}
			}
			src = filepath.Join(cfg.Checkpoint.Root, src)
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), rf.timeout)
		defer cancel()
		p := newProgress(progressOut(cmd, format))
		start := time.Now()
		res, err := pushCheckpoint(ctx, p, src, args[1], rf.registry())
		if err != nil {
			return err
		}
		out := transferResult{Name: name, Dir: src, Ref: res.Ref, Digest: res.Digest.String(), Bytes: res.Bytes,
			Containers: containerNames(res.Manifest), Seconds: time.Since(start).Seconds()}
		return printOutput(cmd.OutOrStdout(), format, out, func(w io.Writer) {
			fmt.Fprintf(w, "pushed %s (%s, %s) in %s\n", name, strings.Join(out.Containers, ", "), human(out.Bytes), time.Since(start).Round(time.Millisecond))
			fmt.Fprintf(w, "digest: %s\n", out.Ref)
		})
	})
	return cmd
}

// pushCheckpoint pushes with progress: the hashing of the archives, then the
// upload (go-containerregistry's counts).
func pushCheckpoint(ctx context.Context, p *progress, dir, ref string, reg ociartifact.Registry) (*ociartifact.Pushed, error) {
	var hashed, total, complete atomic.Int64
	updates := make(chan v1.Update, 16)
	reg.Progress = updates
	go func() {
		for u := range updates {
			total.Store(u.Total)
			complete.Store(u.Complete)
		}
	}()
	p.line("pushing %s to %s", dir, ref)
	stop := p.every(func() string {
		if t := total.Load(); t > 0 {
			return fmt.Sprintf("  uploaded %s of %s", human(complete.Load()), human(t))
		}
		return fmt.Sprintf("  hashed %s", human(hashed.Load()))
	})
	res, err := ociartifact.Push(ctx, dir, ref, reg, func(n int64) { hashed.Add(n) })
	stop()
	if err != nil {
		return nil, fmt.Errorf("push failed: %w", err)
	}
	return res, nil
}

func newCheckpointPullCmd() *cobra.Command {
	var path, format string
	var rf registryFlags
	var maxBytes int64
	cmd := &cobra.Command{
		Use:   "pull REF [NAME]",
		Short: "Pull a pod checkpoint from an OCI registry into checkpoint.root",
		Long: `Pull a pod checkpoint pushed by 'cri-shim checkpoint push' into a new
checkpoint under checkpoint.root, named NAME (default:
<namespace>-<pod>-<UTC time> of the checkpoint). Everything pulled is checked
before it is used: digests and sizes of every manifest and blob, each
archive's members, and the pod manifest with the rules a restore applies; the
checkpoint appears under its name only once complete. Restore it with the pod
annotation checkpoint.cri-shim.io/restore-from: NAME. Works while the shim is
stopped.`,
		Example: "  cri-shim checkpoint pull registry.example.com/checkpoints/web:v1 web-from-node1\n" +
			"  cri-shim checkpoint pull localhost:5000/web@sha256:... --plain-http",
		Args: cobra.RangeArgs(1, 2),
	}
	configFlag(cmd.Flags(), &path, config.DefaultPath, defaultConfigUsage)
	outputFlag(cmd, &format)
	rf.add(cmd)
	cmd.Flags().Int64Var(&maxBytes, "max-bytes", 0, "refuse a checkpoint whose archives exceed this many bytes (default: the config's checkpoint.pull_max_bytes)")
	cmd.RunE = runE(func(cmd *cobra.Command, args []string) error {
		if cmd.Flags().Changed("max-bytes") && maxBytes <= 0 {
			return usageErrorf("--max-bytes %d: must be a number of bytes above 0", maxBytes)
		}
		cfg, err := listingConfig(cmd, path, format, true)
		if err != nil {
			return err
		}
		if !cmd.Flags().Changed("max-bytes") {
			maxBytes = cfg.Checkpoint.PullMaxBytes
		}
		name := ""
		if len(args) == 2 {
			name = args[1]
			if err := layout.CheckNewName(name); err != nil {
				return exitError{2, err}
			}
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), rf.timeout)
		defer cancel()
		p := newProgress(progressOut(cmd, format))
		start := time.Now()
		var planned, written atomic.Int64
		p.line("pulling %s", args[0])
		stop := p.every(func() string {
			return fmt.Sprintf("  fetched %s of %s", human(written.Load()), human(planned.Load()))
		})
		res, err := ociartifact.Pull(ctx, args[0], rf.registry(), ociartifact.PullOptions{
			Root: cfg.Checkpoint.Root, Name: name, MaxBytes: maxBytes,
			Planned: func(n int64) { planned.Store(n) }, Written: func(n int64) { written.Add(n) },
		})
		stop()
		if err != nil {
			return fmt.Errorf("pull failed: %w", err)
		}
		out := transferResult{Name: res.Name, Dir: res.Dir, Ref: args[0], Digest: res.Digest.String(), Bytes: res.Bytes,
			Containers: containerNames(res.Manifest), Seconds: time.Since(start).Seconds()}
		return printOutput(cmd.OutOrStdout(), format, out, func(w io.Writer) {
			fmt.Fprintf(w, "pulled %s (%s/%s: %s, %s) into %s in %s\n", res.Name, res.Manifest.Pod.Namespace, res.Manifest.Pod.Name,
				strings.Join(out.Containers, ", "), human(out.Bytes), res.Dir, time.Since(start).Round(time.Millisecond))
			fmt.Fprintf(w, "digest: %s\n", res.Digest)
			fmt.Fprintf(w, "restore with the pod annotation %s: %q\n", podspec.RestoreFromKey, res.Name)
		})
	})
	return cmd
}
