// conntrack: the tracked flows, filtered.

package main

import (
	"fmt"
	"net/netip"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/inspect"
)

// parseIPv4Flag parses an optional IPv4 address flag.
func parseIPv4Flag(c *cli.Context, name string) (netip.Addr, error) {
	v := c.String(name)
	if v == "" {
		return netip.Addr{}, nil
	}
	ip, err := netip.ParseAddr(v)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, flagError(name, v, "not an IPv4 address")
	}
	return ip, nil
}

func conntrackCommand() *cli.Command {
	var f inspect.FlowFilter
	check := func(c *cli.Context) error {
		if err := noArgs(c); err != nil {
			return err
		}
		f.Service = c.String("service")
		var err error
		if f.Client, err = parseIPv4Flag(c, "client"); err != nil {
			return err
		}
		if f.Backend, err = parseIPv4Flag(c, "backend"); err != nil {
			return err
		}
		if v := c.String("proto"); v != "" {
			if f.Proto, err = inspect.ParseProto(v); err != nil {
				return flagError("proto", v, "unknown protocol")
			}
		}
		return nil
	}
	return &cli.Command{
		Name:  "conntrack",
		Usage: "tracked flows, optionally filtered",
		Flags: []cli.Flag{bpffsFlag(), outputFlag(),
			&cli.StringFlag{Name: "service", Usage: "service port key or prefix (namespace/name)"},
			&cli.StringFlag{Name: "client", Usage: "client IP"},
			&cli.StringFlag{Name: "backend", Usage: "backend IP"},
			&cli.StringFlag{Name: "proto", Usage: "tcp or udp"},
		},
		Action: inspectAction(check, func(c *cli.Context, _ string, dp *dataplane.Dataplane, asJSON bool) error {
			flows, total, err := inspect.Conntrack(dp, f)
			if err != nil {
				return err
			}
			if asJSON {
				if flows == nil {
					flows = []inspect.Flow{}
				}
				return writeJSON(c.App.Writer, struct {
					Total   int            `json:"total"`
					Matched int            `json:"matched"`
					Flows   []inspect.Flow `json:"flows"`
				}{total, len(flows), flows})
			}
			fmt.Fprintf(c.App.Writer, "%s tracked, %d shown\n", plural(uint64(total), "flow", "flows"), len(flows))
			if len(flows) == 0 {
				return nil
			}
			tw := table(c.App.Writer)
			fmt.Fprintln(tw, "PROTO\tCLIENT\tFRONTEND\tBACKEND\tSNAT\tSTATE\tAGE\tIDLE\tSERVICE")
			for _, fl := range flows {
				nat := fl.NAT
				if nat == "" {
					nat = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%ds\t%ds\t%s\n", fl.Proto, fl.Client, fl.Frontend, fl.Backend,
					nat, fl.State, fl.AgeSec, fl.IdleSec, fl.Service)
			}
			return tw.Flush()
		}),
	}
}
