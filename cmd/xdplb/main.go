// Command xdplb is the xdplb agent and its operator tools.
//
//	xdplb agent      run the datapath and keep it in step with Services
//	xdplb detach     remove everything the agent attached or pinned
//	xdplb status     interfaces, programs, map occupancy, last sync
//	xdplb services   frontends, service ports and backends
//	xdplb conntrack  tracked flows
//	xdplb lookup     which backend a new flow would get, and why
//	xdplb maglev     a service port's Maglev table
//	xdplb version
//
// The tools read the pinned maps, so they work while an agent runs and
// after it stopped.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
)

// Set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// run executes the command line and returns the exit code: 0 on success,
// 2 for invalid usage (nothing was attached or changed), 1 otherwise.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	app := newApp(stdout, stderr)
	if err := app.RunContext(ctx, args); err != nil {
		var exit cli.ExitCoder
		if errors.As(err, &exit) {
			if msg := err.Error(); msg != "" {
				fmt.Fprintln(stderr, "xdplb:", msg)
			}
			return exit.ExitCode()
		}
		fmt.Fprintln(stderr, "xdplb:", err)
		return 1
	}
	return 0
}

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "xdplb",
		Usage:     "a Kubernetes Service datapath for edge nodes (XDP + Maglev)",
		Version:   version,
		Writer:    stdout,
		ErrWriter: stderr,
		// Usage errors exit 2 with a message, before anything happens.
		OnUsageError: func(c *cli.Context, err error, isSubcommand bool) error {
			return cli.Exit(err.Error(), 2)
		},
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{
			agentCommand(),
			detachCommand(),
			statusCommand(),
			servicesCommand(),
			conntrackCommand(),
			lookupCommand(),
			maglevCommand(),
			{
				Name:  "version",
				Usage: "print the version",
				Action: func(c *cli.Context) error {
					fmt.Fprintf(c.App.Writer, "xdplb %s (datapath schema %s)\n", version, schemaVersion())
					return nil
				},
			},
		},
	}
}

// usageError is an invalid flag value: exit code 2.
func usageError(format string, args ...any) error {
	return cli.Exit(fmt.Sprintf(format, args...), 2)
}
