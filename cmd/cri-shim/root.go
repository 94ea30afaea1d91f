package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cri-shim/cri-shim/internal/version"
)

// An exitError ends a command with code; a nil err means the command has
// already said what went wrong (doctor's report).
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e exitError) Unwrap() error { return e.err }

// usageErrorf is a mistake in the command line: exit 2, with a pointer to --help.
func usageErrorf(format string, a ...any) error {
	return exitError{2, fmt.Errorf(format, a...)}
}

// newRootCmd builds the command tree. Every command writes to cmd's out and
// err streams, so tests run it against buffers (cobra's completion command
// takes its stream when it is added).
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "cri-shim",
		Short: "A CRI proxy between the kubelet and containerd",
		Long: `cri-shim is a CRI proxy between the kubelet and containerd that adds in-place
pod restarts, a tunable restart backoff, pod checkpoint/restore with CRIU and an
orchestrator sidecar channel. 'serve' runs it; the other commands inspect and
operate a node.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		// The version flag without cobra's -v shorthand (kubectl's -v is verbosity).
		Version: version.String(),
	}
	root.Flags().Bool("version", false, "print the version")
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return exitError{2, err} })
	root.AddCommand(newServeCmd(), newVersionCmd(), newConfigCmd(), newBackoffCmd(), newPodsCmd(),
		newCheckpointCmd(), newCheckpointsCmd(), newDoctorCmd(), newCompletedCmd(), newRouterCmd())
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	strict(root)
	return root
}

// strict makes every command refuse what it does not take: a command group
// (root, config, completion) shows its help when called alone and refuses an
// unknown subcommand, instead of cobra's help and exit 0; a command that
// declares no argument rule takes none.
func strict(c *cobra.Command) {
	if c.Args == nil && !c.DisableFlagParsing && c.Name() != "help" {
		c.Args = noArgs
	}
	if !c.Runnable() {
		c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	for _, sub := range c.Commands() {
		strict(sub)
	}
}

// noArgs refuses positional arguments: an unknown subcommand of a group, an
// unexpected argument of a command.
func noArgs(cmd *cobra.Command, args []string) error {
	switch {
	case len(args) == 0:
		return nil
	case cmd.HasAvailableSubCommands():
		return fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return fmt.Errorf("%q takes no arguments, got %q", cmd.CommandPath(), args)
}

// run executes the command line and returns the exit code: 0, 1 when the
// command failed, 2 for a mistake in the command line. Errors are printed
// once, as "cri-shim: <message>".
func run(args []string) int {
	return execute(args, os.Stdout, os.Stderr)
}

func execute(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	if args == nil {
		args = []string{} // nil would make cobra read os.Args
	}
	root.SetArgs(args)
	cmd, _, err := root.Find(args)
	if err == nil {
		err = singleDash(cmd, args)
	}
	if err == nil {
		cmd, err = root.ExecuteC()
	}
	if err == nil {
		return 0
	}
	code := 2 // cobra's own errors: unknown command, flag or argument
	var ee exitError
	if errors.As(err, &ee) {
		code = ee.code
		if ee.err == nil {
			return code
		}
	}
	fmt.Fprintf(stderr, "cri-shim: %v\n", err)
	if code == 2 {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

// singleDash refuses a long flag given with one dash (the Go flag package's
// style, "-config F"), which pflag would read as short flags ("-c onfig").
func singleDash(cmd *cobra.Command, args []string) error {
	if cmd.DisableFlagParsing {
		return nil
	}
	for _, a := range args {
		if a == "--" {
			return nil
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			name, _, _ := strings.Cut(a[1:], "=")
			if cmd.Flags().Lookup(name) != nil || cmd.InheritedFlags().Lookup(name) != nil {
				return usageErrorf("flag %s: long flags take two dashes (--%s)", a, name)
			}
		}
	}
	return nil
}

// failed marks a run error (exit 1); usage errors pass through unchanged.
func failed(err error) error {
	var ee exitError
	if err == nil || errors.As(err, &ee) {
		return err
	}
	return exitError{1, err}
}

// runE adapts a command's action so that what it returns exits 1 unless it
// says otherwise.
func runE(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error { return failed(f(cmd, args)) }
}

// configFlag adds --config (-c, as crictl's) to a flag set.
func configFlag(fs *pflag.FlagSet, path *string, def, usage string) {
	fs.StringVarP(path, "config", "c", def, usage)
}
