package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckptstore"
	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
)

func newCheckpointCmd() *cobra.Command {
	var path, ns, pod, name string
	var timeout time.Duration
	var sequential bool
	cmd := &cobra.Command{
		Use:   "checkpoint --pod NAME [--namespace NS] [--name CP]",
		Short: "Checkpoint a running pod through the shim (CheckpointPod)",
		Long: `Checkpoint a running pod through the shim's own CRI socket (CheckpointPod) into
a new directory under checkpoint.root. The shim must be running. Progress is
shown in place on a terminal and as one line per step otherwise.
'push' and 'pull' move a checkpoint to and from an OCI registry.`,
		Example: "  cri-shim checkpoint --namespace default --pod web\n  cri-shim checkpoint --pod web --name web-before-upgrade --timeout 5m",
	}
	configFlag(cmd.Flags(), &path, config.DefaultPath, defaultConfigUsage)
	cmd.Flags().StringVar(&ns, "namespace", "default", "namespace of the pod")
	cmd.Flags().StringVar(&pod, "pod", "", "name of the pod (required)")
	cmd.Flags().StringVar(&name, "name", "", "checkpoint name, a directory under checkpoint.root (default: <namespace>-<pod>-<UTC time>)")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "deadline of the CheckpointPod call")
	cmd.Flags().BoolVar(&sequential, "sequential", false, "capture the containers one after another instead of in parallel")
	_ = cmd.MarkFlagRequired("pod")
	cmd.AddCommand(newCheckpointPushCmd(), newCheckpointPullCmd())
	cmd.RunE = runE(func(cmd *cobra.Command, _ []string) error {
		cfg, err := loadConfig(cmd, path, true)
		if err != nil {
			return err
		}
		if name == "" {
			name = fmt.Sprintf("%s-%s-%s", ns, pod, time.Now().UTC().Format("20060102T150405Z"))
		}
		if err := layout.CheckNewName(name); err != nil {
			return exitError{2, err}
		}
		rt, closeConn, err := dialShim(cmd.Context(), cfg)
		if err != nil {
			return err
		}
		defer closeConn()
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		defer cancel()
		return checkpointPod(ctx, rt, newProgress(cmd.OutOrStdout()), cfg.Checkpoint.Root, ns, pod, name, sequential)
	})
	return cmd
}

// checkpointPod finds the pod's ready sandbox and running containers and
// checkpoints them into root/name.
func checkpointPod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, p *progress, root, ns, pod, name string, sequential bool) error {
	sbs, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{"io.kubernetes.pod.namespace": ns, "io.kubernetes.pod.name": pod},
	}})
	if err != nil {
		return fmt.Errorf("listing pods: %s", status.Convert(err).Message())
	}
	if len(sbs.Items) != 1 {
		return fmt.Errorf("want one ready sandbox of pod %s/%s, found %d", ns, pod, len(sbs.Items))
	}
	sb := sbs.Items[0]
	cs, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		PodSandboxId: sb.Id, State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}})
	if err != nil {
		return fmt.Errorf("listing containers: %s", status.Convert(err).Message())
	}
	if len(cs.Containers) == 0 {
		return fmt.Errorf("pod %s/%s has no running container", ns, pod)
	}
	var ids, names []string
	for _, c := range cs.Containers {
		ids = append(ids, c.Id)
		names = append(names, c.Metadata.GetName())
	}
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	opts := map[string]string{capture.OptionManaged: "true"}
	if sequential {
		opts[capture.OptionSequential] = "true"
	}
	p.line("checkpointing pod %s/%s (%s) into %s", ns, pod, strings.Join(names, ", "), dir)
	start := time.Now()
	stop := p.every(func() string {
		return fmt.Sprintf("  %s elapsed, %s written", time.Since(start).Round(time.Second), human(dirSize(dir)))
	})
	_, err = rt.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: sb.Id, OutputPath: dir, ContainerIds: ids, Options: opts})
	stop()
	if err != nil {
		os.Remove(dir) // the shim emptied it; the directory is ours
		return fmt.Errorf("checkpoint failed (%s): %s", status.Code(err), status.Convert(err).Message())
	}
	m, err := layout.ReadManifest(dir)
	if err != nil {
		return err
	}
	p.line("checkpoint %s: %d containers, %s, in %s (pod paused %s)", name, len(m.Containers), human(m.SizeBytes),
		time.Since(start).Round(time.Millisecond), seconds(m.FrozenSeconds).Round(time.Millisecond))
	p.line("restore with the pod annotation %s: %q", podspec.RestoreFromKey, name)
	return nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Update intervals of progress on a terminal and in a log.
var ttyInterval, plainInterval = time.Second, 10 * time.Second

// checkpointList is the -o json|yaml form of `cri-shim checkpoints`.
type checkpointList struct {
	Checkpoints []checkpointItem `json:"checkpoints"`
	// Skipped are directories under the root that are not readable checkpoints.
	Skipped []string `json:"skipped"`
}

type checkpointItem struct {
	Name           string    `json:"name"`
	Dir            string    `json:"dir"`
	Namespace      string    `json:"namespace"`
	Pod            string    `json:"pod"`
	PodUID         string    `json:"podUid"`
	CheckpointedAt time.Time `json:"checkpointedAt"`
	SizeBytes      int64     `json:"sizeBytes"`
	Containers     []string  `json:"containers"`
	PausedSeconds  float64   `json:"pausedSeconds"`
	TotalSeconds   float64   `json:"totalSeconds"`
	Managed        bool      `json:"managed"`
	Runtime        string    `json:"runtime"`
	CRIUVersion    string    `json:"criuVersion"`
}

func newCheckpointsCmd() *cobra.Command {
	var path, format string
	cmd := &cobra.Command{
		Use:   "checkpoints",
		Short: "List the checkpoints under checkpoint.root (rm: remove some)",
		Long: `List the checkpoints under checkpoint.root, oldest first, from their manifests.
It reads the directories only, so it works while the shim is stopped.
Directories that are not readable checkpoints are reported as skipped.`,
		Example: "  cri-shim checkpoints -o yaml\n  cri-shim checkpoints rm default-web-20260101T000000Z",
	}
	configFlag(cmd.PersistentFlags(), &path, config.DefaultPath, defaultConfigUsage)
	outputFlag(cmd, &format)
	cmd.RunE = runE(func(cmd *cobra.Command, _ []string) error {
		cfg, err := listingConfig(cmd, path, format, true)
		if err != nil {
			return err
		}
		list := listCheckpoints(cfg.Checkpoint.Root)
		for _, p := range list.Skipped {
			fmt.Fprintln(cmd.ErrOrStderr(), "skipped:", p)
		}
		return printOutput(cmd.OutOrStdout(), format, list, func(out io.Writer) {
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tPOD\tTIME\tSIZE\tCONTAINERS\tPAUSED\tMANAGED")
			for _, c := range list.Checkpoints {
				fmt.Fprintf(w, "%s\t%s/%s\t%s\t%s\t%s\t%s\t%v\n", c.Name, c.Namespace, c.Pod, c.CheckpointedAt.Format(time.RFC3339),
					human(c.SizeBytes), strings.Join(c.Containers, ","), seconds(c.PausedSeconds).Round(time.Millisecond), c.Managed)
			}
			w.Flush()
		})
	})
	rm := &cobra.Command{
		Use:     "rm NAME...",
		Short:   "Remove checkpoints by name",
		Example: "  cri-shim checkpoints rm default-web-20260101T000000Z",
		Args:    cobra.MinimumNArgs(1),
	}
	rm.RunE = runE(func(cmd *cobra.Command, names []string) error {
		cfg, err := loadConfig(cmd, path, true)
		if err != nil {
			return err
		}
		failures := 0
		for _, n := range names {
			if err := removeCheckpoint(cfg.Checkpoint.Root, n); err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "cri-shim:", err)
				failures++
				continue
			}
			fmt.Fprintln(cmd.OutOrStdout(), "removed", n)
		}
		if failures > 0 {
			return exitError{1, nil} // each said
		}
		return nil
	})
	cmd.AddCommand(rm)
	return cmd
}

func listCheckpoints(root string) checkpointList {
	stored, problems := ckptstore.List(root)
	list := checkpointList{Checkpoints: []checkpointItem{}, Skipped: append([]string{}, problems...)}
	for _, c := range stored {
		m := c.Manifest
		it := checkpointItem{Name: c.Name, Dir: c.Dir, Namespace: m.Pod.Namespace, Pod: m.Pod.Name, PodUID: m.Pod.UID,
			CheckpointedAt: m.CheckpointedAt, SizeBytes: m.SizeBytes, Containers: []string{}, PausedSeconds: m.FrozenSeconds,
			TotalSeconds: m.TotalSeconds, Managed: m.Managed, Runtime: m.Runtime, CRIUVersion: m.CRIUVersion}
		for _, e := range m.Containers {
			it.Containers = append(it.Containers, e.Name)
		}
		list.Checkpoints = append(list.Checkpoints, it)
	}
	return list
}

func removeCheckpoint(root, name string) error {
	if err := layout.CheckName(name); err != nil {
		return err
	}
	dir := filepath.Join(root, name)
	if _, err := os.Lstat(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// newCompletedCmd is what a completed init container of a warm-started pod
// runs instead of its own command (the shim mounts its binary into it as
// warm.CompletedMountPath, with the arguments "completed <container>
// <checkpoint>"). It takes its arguments as they come and always exits 0.
func newCompletedCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "completed CONTAINER CHECKPOINT",
		Short:              "Stand in for an init container that completed before its pod's checkpoint",
		Hidden:             true,
		DisableFlagParsing: true,
		Run: func(cmd *cobra.Command, args []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "cri-shim: init container %s completed before checkpoint %s was taken; not run again\n", arg(args, 0), arg(args, 1))
		},
	}
}

func arg(a []string, i int) string {
	if i < len(a) {
		return a[i]
	}
	return "?"
}

// shimCheckTimeout bounds the check that the shim's socket answers.
const shimCheckTimeout = 5 * time.Second

// dialShim connects to the shim's CRI socket and checks that it answers (CRI
// Version), so a command that needs the running shim fails clearly instead of
// showing stale or empty state.
func dialShim(ctx context.Context, cfg config.Config) (runtimeapi.RuntimeServiceClient, func(), error) {
	sock := strings.TrimPrefix(cfg.Server.Listen, "unix://")
	unreachable := func(err error) error {
		return fmt.Errorf("the shim is not reachable at %s: %v (is it running? systemctl status cri-shim)", sock, err)
	}
	ctx, cancel := context.WithTimeout(ctx, shimCheckTimeout)
	defer cancel()
	// A plain connect first: its error names the cause (no such file,
	// connection refused, permission denied) without gRPC's wrapping.
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", sock)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) {
			err = op.Err
		}
		return nil, nil, unreachable(err)
	}
	c.Close()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, unreachable(err)
	}
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		conn.Close()
		return nil, nil, unreachable(errors.New(status.Convert(err).Message()))
	}
	return rt, func() { conn.Close() }, nil
}
