// The read-only commands' shared pieces: --output, the action that opens
// the pins for them, and table and JSON writers. One file per command
// beside it: status.go, services.go, conntrack.go, lookup.go, maglev.go;
// detach.go changes what the others read.

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/inspect"
)

func outputFlag() cli.Flag {
	return &cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table or json"}
}

// outputJSON validates --output and reports whether it is json.
func outputJSON(c *cli.Context) (bool, error) {
	switch format := c.String("output"); format {
	case "table":
		return false, nil
	case "json":
		return true, nil
	default:
		return false, flagError("output", format, "unknown format")
	}
}

// inspectAction validates the common flags, checks the command's own with
// check, then opens the pinned maps and calls fn. Usage errors (exit 2)
// come before the pins are opened.
func inspectAction(check func(c *cli.Context) error, fn func(c *cli.Context, root string, dp *dataplane.Dataplane, asJSON bool) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		asJSON, err := outputJSON(c)
		if err != nil {
			return err
		}
		root, err := pinRoot(c)
		if err != nil {
			return err
		}
		if check != nil {
			if err := check(c); err != nil {
				return err
			}
		} else if err := noArgs(c); err != nil {
			return err
		}
		dp, err := inspect.Open(root)
		if err != nil {
			return err
		}
		defer dp.Maps().Close()
		return fn(c, root, dp, asJSON)
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func plural(n uint64, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
