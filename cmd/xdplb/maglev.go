// maglev: a service port's Maglev table.

package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/inspect"
)

func maglevCommand() *cli.Command {
	check := func(c *cli.Context) error {
		switch {
		case c.NArg() == 0:
			return usageError("maglev: missing SERVICE argument (namespace/name, or a service port key namespace/name:port/PROTO)")
		case c.NArg() > 1:
			return usageError("maglev: want one SERVICE argument, got %d %q; flags go before it: xdplb maglev -o json %s",
				c.NArg(), c.Args().Slice(), c.Args().First())
		}
		return nil
	}
	return &cli.Command{
		Name:      "maglev",
		Usage:     "a service port's Maglev table: slots per backend and balance",
		ArgsUsage: "SERVICE (namespace/name, or a service port key)",
		Flags:     []cli.Flag{bpffsFlag(), outputFlag()},
		Action: inspectAction(check, func(c *cli.Context, _ string, dp *dataplane.Dataplane, asJSON bool) error {
			name := c.Args().First()
			reports, err := inspect.Tables(dp, name)
			if err != nil {
				return err
			}
			if len(reports) == 0 {
				items, err := inspect.Services(dp)
				if err != nil {
					return err
				}
				for _, f := range items {
					if inspect.MatchService(f.Service, name) {
						what := map[string]string{"drop": "dropped", "reject": "refused"}[f.WhenEmpty]
						return fmt.Errorf("%s has no Maglev table: no usable endpoints, new connections are %s", f.Service, what)
					}
				}
				return fmt.Errorf("no service port matches %q (see xdplb services)", name)
			}
			if asJSON {
				return writeJSON(c.App.Writer, reports)
			}
			for i, r := range reports {
				if i > 0 {
					fmt.Fprintln(c.App.Writer)
				}
				fmt.Fprintf(c.App.Writer, "%s: table %d, %d slots, balance %.3f (max/mean)\nfrontends: %s\n",
					r.Service, r.TableID, r.Size, r.Balance, strings.Join(r.Frontends, ", "))
				tw := table(c.App.Writer)
				fmt.Fprintln(tw, "BACKEND\tID\tSLOTS\tSHARE\tSTATE")
				for _, b := range r.Backends {
					state := "active"
					if b.Terminating {
						state = "terminating"
					}
					state += backendPlace(b)
					fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f%%\t%s\n", b.Address, b.ID, b.Slots, 100*float64(b.Slots)/float64(r.Size), state)
				}
				tw.Flush()
			}
			return nil
		}),
	}
}
