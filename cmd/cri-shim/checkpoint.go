package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/criu"
)

// checkpointCmd checkpoints a running pod through the shim's own CRI socket
// (CheckpointPod), into a new directory under the checkpoint root.
func checkpointCmd(args []string) int {
	fs := flag.NewFlagSet("checkpoint", flag.ContinueOnError)
	cfgPath := fs.String("config", config.DefaultPath, "config file (absent default file: built-in defaults)")
	ns := fs.String("namespace", "default", "namespace of the pod")
	pod := fs.String("pod", "", "name of the pod (required)")
	name := fs.String("name", "", "checkpoint name, a directory under checkpoint.root (default: <namespace>-<pod>-<UTC time>)")
	timeout := fs.Duration("timeout", time.Minute, "deadline of the CheckpointPod call")
	sequential := fs.Bool("sequential", false, "capture the containers one after another instead of in parallel")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *pod == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: cri-shim checkpoint --namespace NS --pod NAME [--name CP] [--timeout 60s] [--sequential]")
		return 2
	}
	cfg, code, ok := loadParsed(fs, *cfgPath, true)
	if !ok {
		return code
	}
	if *name == "" {
		*name = fmt.Sprintf("%s-%s-%s", *ns, *pod, time.Now().UTC().Format("20060102T150405Z"))
	}
	if err := criu.CheckName(*name); err != nil {
		fmt.Fprintln(os.Stderr, "cri-shim:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	rt, closeConn, err := dialShim(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cri-shim:", err)
		return 1
	}
	defer closeConn()
	sbs, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{"io.kubernetes.pod.namespace": *ns, "io.kubernetes.pod.name": *pod},
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cri-shim: listing pods:", status.Convert(err).Message())
		return 1
	}
	if len(sbs.Items) != 1 {
		fmt.Fprintf(os.Stderr, "cri-shim: want one ready sandbox of pod %s/%s, found %d\n", *ns, *pod, len(sbs.Items))
		return 1
	}
	sb := sbs.Items[0]
	cs, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		PodSandboxId: sb.Id, State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cri-shim: listing containers:", status.Convert(err).Message())
		return 1
	}
	if len(cs.Containers) == 0 {
		fmt.Fprintf(os.Stderr, "cri-shim: pod %s/%s has no running container\n", *ns, *pod)
		return 1
	}
	var ids, names []string
	for _, c := range cs.Containers {
		ids = append(ids, c.Id)
		names = append(names, c.Metadata.GetName())
	}
	dir := filepath.Join(cfg.Checkpoint.Root, *name)
	if err := os.MkdirAll(cfg.Checkpoint.Root, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, "cri-shim:", err)
		return 1
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, "cri-shim:", err)
		return 1
	}
	opts := map[string]string{criu.OptionManaged: "true"}
	if *sequential {
		opts[criu.OptionSequential] = "true"
	}
	fmt.Printf("checkpointing pod %s/%s (%s) into %s\n", *ns, *pod, strings.Join(names, ", "), dir)
	start := time.Now()
	done := make(chan struct{})
	go progress(done, start, dir)
	_, err = rt.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: sb.Id, OutputPath: dir, ContainerIds: ids, Options: opts})
	close(done)
	if err != nil {
		os.Remove(dir) // the shim emptied it; the directory is ours
		fmt.Fprintf(os.Stderr, "\ncri-shim: checkpoint failed (%s): %s\n", status.Code(err), status.Convert(err).Message())
		return 1
	}
	m, err := criu.ReadManifest(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "\ncri-shim:", err)
		return 1
	}
	fmt.Printf("\rcheckpoint %s: %d containers, %s, in %s (pod paused %s)\n", *name, len(m.Containers), human(m.SizeBytes),
		time.Since(start).Round(time.Millisecond), (time.Duration(m.FrozenSeconds * float64(time.Second))).Round(time.Millisecond))
	fmt.Printf("restore with the pod annotation %s: %q\n", criu.RestoreFromAnnotation, *name)
	return 0
}

// progress prints a line every second while a long dump runs.
func progress(done <-chan struct{}, start time.Time, dir string) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			fmt.Printf("\r  %s elapsed, %s written", time.Since(start).Round(time.Second), human(dirSize(dir)))
		}
	}
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

func human(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// checkpointsCmd lists the checkpoints under the root, or removes one.
func checkpointsCmd(args []string) int {
	fs := flag.NewFlagSet("checkpoints", flag.ContinueOnError)
	cfgPath := fs.String("config", config.DefaultPath, "config file (absent default file: built-in defaults)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, code, ok := loadParsed(fs, *cfgPath, true)
	if !ok {
		return code
	}
	rest := fs.Args()
	if len(rest) > 0 {
		if rest[0] != "rm" || len(rest) < 2 {
			fmt.Fprintln(os.Stderr, "usage: cri-shim checkpoints [--config F] [rm NAME...]")
			return 2
		}
		rc := 0
		for _, n := range rest[1:] {
			if err := criu.CheckName(n); err != nil {
				fmt.Fprintln(os.Stderr, "cri-shim:", err)
				rc = 1
				continue
			}
			dir := filepath.Join(cfg.Checkpoint.Root, n)
			if _, err := os.Lstat(dir); err != nil {
				fmt.Fprintln(os.Stderr, "cri-shim:", err)
				rc = 1
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				fmt.Fprintln(os.Stderr, "cri-shim:", err)
				rc = 1
				continue
			}
			fmt.Println("removed", n)
		}
		return rc
	}
	list, problems := criu.List(cfg.Checkpoint.Root)
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tPOD\tTIME\tSIZE\tCONTAINERS\tPAUSED\tMANAGED")
	for _, c := range list {
		m := c.Manifest
		var cs []string
		for _, e := range m.Containers {
			cs = append(cs, e.Name)
		}
		fmt.Fprintf(w, "%s\t%s/%s\t%s\t%s\t%s\t%s\t%v\n", c.Name, m.Pod.Namespace, m.Pod.Name, m.CheckpointedAt.Format(time.RFC3339),
			human(m.SizeBytes), strings.Join(cs, ","), (time.Duration(m.FrozenSeconds * float64(time.Second))).Round(time.Millisecond), m.Managed)
	}
	w.Flush()
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, "skipped:", p)
	}
	return 0
}

// completedCmd is what a completed init container of a warm-started pod runs
// instead of its own command (the shim mounts its binary into it).
func completedCmd(args []string) int {
	fmt.Printf("cri-shim: init container %s completed before checkpoint %s was taken; not run again\n", arg(args, 0), arg(args, 1))
	return 0
}

func arg(a []string, i int) string {
	if i < len(a) {
		return a[i]
	}
	return "?"
}

func dialShim(cfg config.Config) (runtimeapi.RuntimeServiceClient, func(), error) {
	sock := strings.TrimPrefix(cfg.Server.Listen, "unix://")
	if _, err := os.Stat(sock); err != nil {
		return nil, nil, fmt.Errorf("shim socket: %w (is cri-shim running?)", err)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, errors.Join(errors.New("shim socket"), err)
	}
	return runtimeapi.NewRuntimeServiceClient(conn), func() { conn.Close() }, nil
}
