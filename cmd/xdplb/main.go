// Command xdplb is the xdplb agent and its operator tools.
//
//	xdplb agent      run the datapath and keep it in step with Services
//	xdplb detach     remove everything the agent attached or pinned
//	xdplb status     interfaces, programs, map occupancy, last sync
//	xdplb services   frontends, service ports and backends
//	xdplb conntrack  tracked flows
//	xdplb lookup     which backend a new flow would get, and why
//	xdplb maglev     a service port's Maglev table
//	xdplb version    versions of the binary, Go and the BPF programs
//
// The tools read the pinned maps, so they work while an agent runs and
// after it stopped.
//
// Exit codes: 0 success, 1 failure, 2 invalid usage (a bad flag, value or
// argument; nothing was attached, pinned or changed).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
)

// Set at build time with -ldflags "-X main.version=..."; see versionInfo for
// what is used otherwise.
var version = "dev"

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(context.Background(), os.Args, os.Stdout, os.Stderr, runAgent))
}

// run executes the command line and returns the exit code: 0 on success,
// 2 for invalid usage (nothing was attached or changed), 1 otherwise.
// The agent command hands its validated configuration to agent, which
// runs until ctx ends or SIGTERM or SIGINT arrives (see untilSignalled).
func run(ctx context.Context, args []string, stdout, stderr io.Writer, agent agentRunner) int {
	app := newApp(stdout, stderr, agent)
	err := app.RunContext(ctx, args)
	if err == nil {
		return exitOK
	}
	code := exitFailure
	var exit cli.ExitCoder
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	}
	// One line: the first line of a multi-line error is the summary, the
	// rest (a verifier log, say) follows indented.
	if msg := strings.TrimRight(err.Error(), "\n"); msg != "" {
		fmt.Fprintln(stderr, "xdplb:", strings.ReplaceAll(msg, "\n", "\n  "))
	}
	return code
}

func newApp(stdout, stderr io.Writer, agent agentRunner) *cli.App {
	commands := []*cli.Command{
		agentCommand(agent),
		detachCommand(),
		statusCommand(),
		servicesCommand(),
		conntrackCommand(),
		lookupCommand(),
		maglevCommand(),
		versionCommand(),
	}
	var names []string
	for _, c := range commands {
		c.HideHelpCommand = true
		c.OnUsageError = onUsageError
		names = append(names, c.Name)
	}
	return &cli.App{
		Name:      "xdplb",
		Usage:     "a Kubernetes Service datapath for edge nodes (XDP + Maglev)",
		Version:   version,
		Writer:    stdout,
		ErrWriter: stderr,
		// Usage errors exit 2 with a message, before anything happens.
		OnUsageError:   onUsageError,
		ExitErrHandler: func(*cli.Context, error) {},
		Commands:       commands,
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError("unknown command %q; commands: %s (see xdplb --help)", c.Args().First(), strings.Join(names, ", "))
			}
			cli.ShowAppHelp(c)
			return usageError("")
		},
	}
}

// usageError is invalid usage: exit code 2.
func usageError(format string, args ...any) error {
	return cli.Exit(fmt.Sprintf(format, args...), exitUsage)
}

// noArgs rejects positional arguments of a command that takes none.
func noArgs(c *cli.Context) error {
	if c.NArg() == 0 {
		return nil
	}
	return usageError("%s: unexpected argument %q: this command takes flags only (see xdplb %s --help)",
		c.Command.Name, c.Args().First(), c.Command.Name)
}
