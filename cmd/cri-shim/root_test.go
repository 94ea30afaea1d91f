package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// commands returns the command path (without "cri-shim") of every command
// of the tree that an operator can call, hidden ones left out.
func commands(c *cobra.Command) [][]string {
	var out [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		if c.Hidden {
			return
		}
		out = append(out, path)
		for _, sub := range c.Commands() {
			walk(sub, append(append([]string(nil), path...), sub.Name()))
		}
	}
	walk(c, nil)
	return out
}

// --help and -h on every command print its usage to stdout and exit 0.
func TestHelpOnEveryCommand(t *testing.T) {
	cmds := commands(newRootCmd(io.Discard, io.Discard))
	if len(cmds) < 15 {
		t.Fatalf("walked only %d commands: %v", len(cmds), cmds)
	}
	for _, path := range cmds {
		for _, h := range []string{"--help", "-h"} {
			args := append(append([]string(nil), path...), h)
			code, out, stderr := runOut(t, args...)
			if code != 0 || stderr != "" || !strings.Contains(out, "Usage:") {
				t.Errorf("%v: exit %d, stdout %.80q, stderr %q", args, code, out, stderr)
			}
		}
	}
	// help COMMAND, as kubectl's.
	if code, out, _ := runOut(t, "help", "pods"); code != 0 || !strings.Contains(out, "cri-shim pods [flags]") {
		t.Errorf("help pods: exit %d, %q", code, out)
	}
}

// Unknown commands, flags and extra arguments are refused with exit 2 and
// one clear line, whatever the command.
func TestRejectsUnknownFlagsAndArguments(t *testing.T) {
	takesArgs := map[string]bool{"help": true, "config check": true, "checkpoints rm": true, "checkpoint push": true, "checkpoint pull": true}
	for _, path := range commands(newRootCmd(io.Discard, io.Discard)) {
		name := strings.Join(path, " ")
		if name == "help" {
			continue // help takes any command path
		}
		cases := [][]string{append(append([]string(nil), path...), "--no-such-flag")}
		if !takesArgs[name] {
			cases = append(cases, append(append([]string(nil), path...), "extra"))
		}
		for _, args := range cases {
			if cmd, _, _ := newRootCmd(io.Discard, io.Discard).Find(path); cmd.Flags().Lookup("config") != nil {
				// A command that wrongly ran would fail on this (exit 1)
				// instead of, for serve, serving.
				args = append(args, "--config=/nonexistent/cri-shim.toml")
			}
			code, out, stderr := runOut(t, args...)
			if code != 2 {
				t.Errorf("%v: exit %d, want 2 (stdout %.80q)", args, code, out)
			}
			if !strings.HasPrefix(stderr, "cri-shim: ") || !strings.Contains(stderr, "--help' for usage") ||
				!(strings.Contains(stderr, "unknown flag: --no-such-flag") || strings.Contains(stderr, `"extra"`)) {
				t.Errorf("%v: stderr %q", args, stderr)
			}
			checkOnePrefix(t, args, stderr)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"config", "check", "a.toml", "b.toml"}, "accepts at most 1 arg"},
		{[]string{"checkpoints", "rm"}, "requires at least 1 arg"},
		{[]string{"checkpoint"}, `required flag(s) "pod" not set`},
		{[]string{"checkpoint", "push", "a"}, "accepts 2 arg(s), received 1"},
		{[]string{"checkpoint", "pull"}, "accepts between 1 and 2 arg(s), received 0"},
		{[]string{"checkpoint", "pull", "r", "n", "x"}, "accepts between 1 and 2 arg(s), received 3"},
		{[]string{"checkpoint", "--pod", "p", "--timeout", "soon"}, "invalid argument"},
		{[]string{"pods", "-o", "xml"}, `unknown output format "xml"`},
		{[]string{"checkpoints", "-o", "wide"}, `unknown output format "wide"`},
		{[]string{"backoff", "--output=csv"}, `unknown output format "csv"`},
		{[]string{"pods", "-config", "x"}, "flag -config: long flags take two dashes (--config)"},
		{[]string{"checkpoints", "rm", "-config=x", "cp"}, "flag -config=x: long flags take two dashes (--config)"},
		{[]string{"serve", "-listen", "/x"}, "flag -listen: long flags take two dashes"},
	} {
		code, stderr := runCaptured(t, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, stderr, tc.want)
		}
		checkOnePrefix(t, tc.args, stderr)
	}
	// A group called alone shows its help, as kubectl's.
	for _, args := range [][]string{{}, {"config"}, {"completion"}} {
		if code, out, _ := runOut(t, args...); code != 0 || !strings.Contains(out, "Available Commands:") {
			t.Errorf("%v: exit %d, %.80q", args, code, out)
		}
	}
}

func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		code, out, stderr := runOut(t, "completion", shell)
		if code != 0 || len(out) < 1000 || !strings.Contains(out, "cri-shim") {
			t.Errorf("completion %s: exit %d, %d bytes, stderr %q", shell, code, len(out), stderr)
		}
	}
	// The completion itself: commands, and -o's values.
	code, out, _ := runOut(t, "__complete", "po")
	if code != 0 || !strings.Contains(out, "pods") {
		t.Errorf("__complete po: %d %q", code, out)
	}
	code, out, _ = runOut(t, "__complete", "pods", "-o", "")
	if code != 0 || !strings.Contains(out, "json") || !strings.Contains(out, "yaml") {
		t.Errorf("__complete pods -o: %d %q", code, out)
	}
}

// completed is what warm-started init containers run (criu.CompletedMountPath
// with "completed <container> <checkpoint>"): its output and exit stay as they
// were, whatever the arguments.
func TestCompletedStandIn(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"completed", "init", "cp-1"}, "cri-shim: init container init completed before checkpoint cp-1 was taken; not run again\n"},
		{[]string{"completed"}, "cri-shim: init container ? completed before checkpoint ? was taken; not run again\n"},
		{[]string{"completed", "--x", "-y", "z"}, "cri-shim: init container --x completed before checkpoint -y was taken; not run again\n"},
	} {
		code, out, stderr := runOut(t, tc.args...)
		if code != 0 || out != tc.want || stderr != "" {
			t.Errorf("%v: exit %d, %q, stderr %q", tc.args, code, out, stderr)
		}
	}
	if _, out, _ := runOut(t, "--help"); strings.Contains(out, "completed") {
		t.Errorf("completed is listed in --help:\n%s", out)
	}
}
