package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/podmgmt"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// podList is the -o json|yaml form of `cri-shim pods`.
type podList struct {
	Pods []podItem `json:"pods"`
	// Channels are the orchestrator sidecar channels of the node's pods.
	Channels []channelItem `json:"channels"`
}

type podItem struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	SandboxID string `json:"sandboxId"`
	// Rules are the restart rules per container name, as annotated.
	Rules      podspec.Rules `json:"rules"`
	Phase      string        `json:"phase"`
	PhaseSince time.Time     `json:"phaseSince"`
	// Restarts are the in-place restarts of the whole pod.
	Restarts          int            `json:"restarts"`
	ContainerRestarts map[string]int `json:"containerRestarts"`
	LastTrigger       *triggerItem   `json:"lastTrigger,omitempty"`
	// NextRestartAt is when a restart waiting out its backoff goes ahead.
	NextRestartAt *time.Time `json:"nextRestartAt,omitempty"`
	Problems      []string   `json:"problems"`
	LastError     string     `json:"lastError,omitempty"`
}

type triggerItem struct {
	Container    string  `json:"container"`
	ExitCode     int32   `json:"exitCode"`
	Action       string  `json:"action"`
	DelaySeconds float64 `json:"delaySeconds"`
}

type channelItem struct {
	Namespace    string `json:"namespace"`
	Name         string `json:"name"`
	Orchestrator string `json:"orchestrator"`
	Port         int    `json:"port"`
	State        string `json:"state"`
}

func newPodsCmd() *cobra.Command {
	var path, format string
	cmd := &cobra.Command{
		Use:   "pods",
		Short: "List the pods cri-shim governs (restart phase, restarts, problems)",
		Long: `List the pods cri-shim governs from its state directory: restart rules, phase,
restarts done, the last trigger and its backoff, problems with their
annotations, and the orchestrator channels. The shim must be running: the
command first checks that its socket answers.`,
		Example: "  cri-shim pods\n  cri-shim pods -o json | jq '.pods[] | select(.problems != [])'",
	}
	configFlag(cmd.Flags(), &path, config.DefaultPath, defaultConfigUsage)
	outputFlag(cmd, &format)
	cmd.RunE = runE(func(cmd *cobra.Command, _ []string) error {
		cfg, err := listingConfig(cmd, path, format, false)
		if err != nil {
			return err
		}
		_, closeConn, err := dialShim(cmd.Context(), cfg)
		if err != nil {
			return err
		}
		closeConn()
		now := time.Now()
		list, err := readPods(cfg.StateDir, now)
		if err != nil {
			return err
		}
		return printOutput(cmd.OutOrStdout(), format, list, func(w io.Writer) { podTable(w, list, now) })
	})
	return cmd
}

func readPods(stateDir string, now time.Time) (podList, error) {
	pods, err := restartrecord.ReadPods(stateDir)
	if err != nil {
		return podList{}, err
	}
	list := podList{Pods: []podItem{}, Channels: []channelItem{}}
	for _, p := range pods {
		it := podItem{Namespace: p.Namespace, Name: p.Name, UID: p.UID, SandboxID: p.SandboxID, Rules: p.Rules,
			Phase: string(p.Phase), PhaseSince: p.PhaseSince, Restarts: p.Restarts, ContainerRestarts: p.ContainerRestarts,
			Problems: p.Problems, LastError: p.LastError}
		if it.Rules == nil {
			it.Rules = podspec.Rules{}
		}
		if it.ContainerRestarts == nil {
			it.ContainerRestarts = map[string]int{}
		}
		if it.Problems == nil {
			it.Problems = []string{}
		}
		if t := p.Trigger; t != nil {
			it.LastTrigger = &triggerItem{Container: t.Container, ExitCode: t.ExitCode, Action: t.Action, DelaySeconds: t.Delay.Seconds()}
		}
		if p.Phase != restartrecord.PhaseRunning && p.NotBefore.After(now) {
			nb := p.NotBefore
			it.NextRestartAt = &nb
		}
		list.Pods = append(list.Pods, it)
	}
	slices.SortFunc(list.Pods, func(a, b podItem) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.SandboxID, b.SandboxID))
	})
	for _, c := range podmgmt.ReadChannels(stateDir) {
		list.Channels = append(list.Channels, channelItem{c.Namespace, c.Name, c.Container, c.Port, c.State})
	}
	return list, nil
}

func podTable(out io.Writer, list podList, now time.Time) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "POD\tSANDBOX\tRULES\tPHASE\tPOD RESTARTS\tCONTAINER RESTARTS\tLAST TRIGGER\tDELAY\tNEXT RESTART IN\tPROBLEMS")
	for _, p := range list.Pods {
		var rules []string
		for c := range p.Rules {
			rules = append(rules, c)
		}
		sort.Strings(rules)
		trigger, next, delay := "-", "-", "-"
		if t := p.LastTrigger; t != nil {
			trigger = fmt.Sprintf("%s exit %d (%s)", t.Container, t.ExitCode, t.Action)
			delay = time.Duration(t.DelaySeconds * float64(time.Second)).String()
		}
		var crs []string
		for c, n := range p.ContainerRestarts {
			crs = append(crs, fmt.Sprintf("%s=%d", c, n))
		}
		sort.Strings(crs)
		if p.NextRestartAt != nil {
			next = p.NextRestartAt.Sub(now).Round(100 * time.Millisecond).String()
		}
		problems := strings.Join(p.Problems, "; ")
		if p.LastError != "" {
			problems = strings.TrimPrefix(problems+"; last error: "+p.LastError, "; ")
		}
		sb := p.SandboxID
		if len(sb) > 13 {
			sb = sb[:13]
		}
		fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, sb, orDash(strings.Join(rules, ",")), p.Phase,
			p.Restarts, orDash(strings.Join(crs, ",")), trigger, delay, next, orDash(problems))
	}
	w.Flush()
	if len(list.Channels) > 0 {
		fmt.Fprintln(out)
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "POD\tORCHESTRATOR\tPORT\tCHANNEL")
		for _, c := range list.Channels {
			fmt.Fprintf(w, "%s/%s\t%s\t%d\t%s\n", c.Namespace, c.Name, c.Orchestrator, c.Port, c.State)
		}
		w.Flush()
	}
}
