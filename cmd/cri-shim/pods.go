package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cri-shim/cri-shim/internal/podmgmt"
	"github.com/cri-shim/cri-shim/internal/podstate"
)

// podsCmd lists the pods cri-shim governs, from its state directory: restart
// phase, restarts done, backoff, and problems with their annotations.
func podsCmd(args []string) int {
	cfg, code, ok := loadConfig("pods", args, false)
	if !ok {
		return code
	}
	pods, err := podstate.ReadPods(cfg.StateDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cri-shim:", err)
		return 1
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Namespace+pods[i].Name < pods[j].Namespace+pods[j].Name })
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "POD\tSANDBOX\tRULES\tPHASE\tPOD RESTARTS\tCONTAINER RESTARTS\tLAST TRIGGER\tDELAY\tNEXT RESTART IN\tPROBLEMS")
	now := time.Now()
	for _, p := range pods {
		var rules []string
		for c := range p.Rules {
			rules = append(rules, c)
		}
		sort.Strings(rules)
		trigger, next, delay := "-", "-", "-"
		if p.Trigger != nil {
			trigger = fmt.Sprintf("%s exit %d (%s)", p.Trigger.Container, p.Trigger.ExitCode, p.Trigger.Action)
			delay = p.Trigger.Delay.String()
		}
		var crs []string
		for c, n := range p.ContainerRestarts {
			crs = append(crs, fmt.Sprintf("%s=%d", c, n))
		}
		sort.Strings(crs)
		if p.Phase != podstate.PhaseRunning && p.NotBefore.After(now) {
			next = p.NotBefore.Sub(now).Round(100 * time.Millisecond).String()
		}
		problems := strings.Join(p.Problems, "; ")
		if p.LastError != "" {
			problems = strings.TrimPrefix(problems+"; last error: "+p.LastError, "; ")
		}
		if problems == "" {
			problems = "-"
		}
		sb := p.SandboxID
		if len(sb) > 13 {
			sb = sb[:13]
		}
		fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, sb, orDash(strings.Join(rules, ",")), p.Phase,
			p.Restarts, orDash(strings.Join(crs, ",")), trigger, delay, next, problems)
	}
	w.Flush()
	if chans := podmgmt.ReadChannels(cfg.StateDir); len(chans) > 0 {
		fmt.Println()
		w = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "POD\tORCHESTRATOR\tPORT\tCHANNEL")
		for _, c := range chans {
			fmt.Fprintf(w, "%s/%s\t%s\t%d\t%s\n", c.Namespace, c.Name, c.Container, c.Port, c.State)
		}
		w.Flush()
	}
	return 0
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
