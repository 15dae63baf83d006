// services: the service ports the datapath serves, with their backends.

package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/inspect"
)

func servicesCommand() *cli.Command {
	return &cli.Command{
		Name:  "services",
		Usage: "frontends, their service ports and backends (with Maglev slots and states)",
		Flags: []cli.Flag{bpffsFlag(), outputFlag()},
		Action: inspectAction(nil, func(c *cli.Context, _ string, dp *dataplane.Dataplane, asJSON bool) error {
			items, err := inspect.Services(dp)
			if err != nil {
				return err
			}
			if asJSON {
				if items == nil {
					items = []inspect.Frontend{}
				}
				return writeJSON(c.App.Writer, items)
			}
			tw := table(c.App.Writer)
			fmt.Fprintln(tw, "FRONTEND\tSERVICE\tPOLICY\tBACKENDS")
			for _, f := range items {
				var policy []string
				if f.External {
					policy = append(policy, "external")
					if f.SNAT {
						policy = append(policy, "snat")
					} else {
						policy = append(policy, "local")
					}
				} else {
					policy = append(policy, "cluster-ip")
				}
				if f.SourceRanges {
					policy = append(policy, "source-ranges")
				}
				if f.AffinitySeconds > 0 {
					policy = append(policy, fmt.Sprintf("affinity=%ds", f.AffinitySeconds))
				}
				var bes []string
				for _, b := range f.Backends {
					state := "active"
					if b.Terminating {
						state = "terminating"
					}
					state += backendPlace(b)
					bes = append(bes, fmt.Sprintf("%s (%s, %d/%d slots)", b.Address, state, b.Slots, f.TableSize))
				}
				if len(bes) == 0 {
					bes = []string{"none: " + f.WhenEmpty}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Frontend, f.Service, strings.Join(policy, ","), strings.Join(bes, ", "))
			}
			return tw.Flush()
		}),
	}
}

// backendPlace is what the backend state column adds for where a backend
// runs: this node, or this node's own address (a hostNetwork pod here).
func backendPlace(b inspect.BackendUse) string {
	switch {
	case b.Host:
		return ",local,host"
	case b.Local:
		return ",local"
	}
	return ""
}
