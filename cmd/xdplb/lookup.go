// lookup: the backend a packet would reach, predicted from the maps.

package main

import (
	"fmt"
	"net/netip"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/inspect"
)

func lookupCommand() *cli.Command {
	var proto uint8
	var src, dst netip.AddrPort
	check := func(c *cli.Context) error {
		if err := noArgs(c); err != nil {
			return err
		}
		var err error
		if proto, err = inspect.ParseProto(c.String("proto")); err != nil {
			return flagError("proto", c.String("proto"), "unknown protocol")
		}
		for _, a := range []struct {
			name string
			dst  *netip.AddrPort
		}{{"src", &src}, {"dst", &dst}} {
			v := c.String(a.name)
			if v == "" {
				return missingFlag(a.name)
			}
			if *a.dst, err = inspect.ParseAddrPort(v); err != nil {
				return flagError(a.name, v, "not an IPv4 address and port")
			}
		}
		return nil
	}
	return &cli.Command{
		Name:  "lookup",
		Usage: "which backend a new flow would get and why, and whether the flow is tracked now",
		Flags: []cli.Flag{bpffsFlag(), outputFlag(),
			&cli.StringFlag{Name: "proto", Value: "tcp", Usage: "tcp or udp"},
			&cli.StringFlag{Name: "src", Usage: "client IP:PORT (required)"},
			&cli.StringFlag{Name: "dst", Usage: "frontend IP:PORT (required)"},
		},
		Action: inspectAction(check, func(c *cli.Context, _ string, dp *dataplane.Dataplane, asJSON bool) error {
			l, err := inspect.LookupFlow(dp, proto, src, dst)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.App.Writer, l)
			}
			w := c.App.Writer
			fmt.Fprintf(w, "frontend: %s\n", l.Frontend)
			if l.Service != "" {
				fmt.Fprintf(w, "service:  %s\n", l.Service)
			}
			fmt.Fprintf(w, "verdict:  %s\n", l.Verdict)
			if l.Backend != "" {
				snat := ""
				switch {
				case l.SNAT:
					snat = " (SNAT to the node address)"
				case l.Host:
					snat = " (this node's own address: handed to its stack)"
				}
				fmt.Fprintf(w, "backend:  %s, id %d%s\n", l.Backend, l.BackendID, snat)
			}
			if l.TableSize > 0 {
				fmt.Fprintf(w, "maglev:   hash %#08x -> slot %d of %d\n", l.Hash, l.Slot, l.TableSize)
			}
			fmt.Fprintf(w, "why:      %s\n", l.Reason)
			if t := l.Tracked; t != nil {
				nat := ""
				if t.NAT != "" {
					nat = ", SNAT " + t.NAT
				}
				fmt.Fprintf(w, "tracked:  yes, to %s (%s%s, age %ds, idle %ds)", t.Backend, t.State, nat, t.AgeSec, t.IdleSec)
				if !t.Usable {
					fmt.Fprintf(w, ", %s", t.Stale)
				}
				fmt.Fprintln(w)
			} else {
				fmt.Fprintln(w, "tracked:  no")
			}
			return nil
		}),
	}
}
