package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/inspect"
	"github.com/xdplb/xdplb/loader"
)

func schemaVersion() string { return loader.SchemaVersion }

func outputFlag() cli.Flag {
	return &cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table or json"}
}

// inspectAction opens the pinned maps and checks the output format before
// calling fn.
func inspectAction(fn func(c *cli.Context, dp *dataplane.Dataplane, asJSON bool) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		format := c.String("output")
		if format != "table" && format != "json" {
			return usageError("--output %q: allowed values are table, json", format)
		}
		dp, err := inspect.Open(c.String("bpffs-root"))
		if err != nil {
			return err
		}
		defer dp.Maps().Close()
		return fn(c, dp, format == "json")
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func detachCommand() *cli.Command {
	return &cli.Command{
		Name:  "detach",
		Usage: "detach the datapath from every interface and remove its pins (flows are forgotten)",
		Flags: []cli.Flag{bpffsFlag()},
		Action: func(c *cli.Context) error {
			if err := loader.Detach(c.String("bpffs-root")); err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, "detached; pins removed from", loader.Dir(c.String("bpffs-root")))
			return nil
		},
	}
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "interfaces and programs, map occupancy, the agent's last sync, counters",
		Flags: []cli.Flag{bpffsFlag(), outputFlag()},
		Action: inspectAction(func(c *cli.Context, dp *dataplane.Dataplane, asJSON bool) error {
			st, err := inspect.GetStatus(c.String("bpffs-root"), dp)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.App.Writer, st)
			}
			w := c.App.Writer
			fmt.Fprintf(w, "Pins:     %s\n", st.PinDir)
			agent := "never ran"
			if st.AgentPID != 0 {
				state := "not running"
				if st.AgentAlive {
					state = "running"
				}
				agent = fmt.Sprintf("pid %d (%s)", st.AgentPID, state)
			}
			fmt.Fprintf(w, "Agent:    %s\n", agent)
			if st.LastSync != nil {
				fmt.Fprintf(w, "Sync:     last %s (%s ago), %d syncs, %d service ports, %d problems\n",
					st.LastSync.UTC().Format(time.RFC3339), time.Since(*st.LastSync).Round(time.Second), st.Syncs, st.Services, st.Problems)
			}
			fmt.Fprintln(w)
			tw := table(w)
			fmt.Fprintln(tw, "INTERFACE\tHOOK\tMODE\tPROGRAM")
			for _, a := range st.Attachments {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s (id %d)\n", a.Interface, a.Hook, a.Mode, a.Program, a.ProgramID)
			}
			tw.Flush()
			fmt.Fprintln(w)
			tw = table(w)
			fmt.Fprintln(tw, "MAP\tENTRIES\tCAPACITY\tUSED")
			for _, m := range st.Maps {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f%%\n", m.Name, m.Entries, m.Capacity, m.Percent)
			}
			tw.Flush()
			if len(st.Counters) > 0 {
				fmt.Fprintln(w)
				tw = table(w)
				fmt.Fprintln(tw, "COUNTER\tPACKETS\tBYTES")
				for _, ctr := range st.Counters {
					fmt.Fprintf(tw, "%s\t%d\t%d\n", ctr.Name, ctr.Packets, ctr.Bytes)
				}
				tw.Flush()
			}
			return nil
		}),
	}
}

func servicesCommand() *cli.Command {
	return &cli.Command{
		Name:  "services",
		Usage: "frontends, their service ports and backends (with Maglev slots and states)",
		Flags: []cli.Flag{bpffsFlag(), outputFlag()},
		Action: inspectAction(func(c *cli.Context, dp *dataplane.Dataplane, asJSON bool) error {
			items, err := inspect.Services(dp)
			if err != nil {
				return err
			}
			if asJSON {
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
					where := ""
					if b.Local {
						where = ",local"
					}
					bes = append(bes, fmt.Sprintf("%s (%s%s, %d/%d slots)", b.Address, state, where, b.Slots, f.TableSize))
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

func conntrackCommand() *cli.Command {
	return &cli.Command{
		Name:  "conntrack",
		Usage: "tracked flows, optionally filtered",
		Flags: []cli.Flag{bpffsFlag(), outputFlag(),
			&cli.StringFlag{Name: "service", Usage: "service port key or prefix (namespace/name)"},
			&cli.StringFlag{Name: "client", Usage: "client IP"},
			&cli.StringFlag{Name: "backend", Usage: "backend IP"},
			&cli.StringFlag{Name: "proto", Usage: "tcp or udp"},
		},
		Action: inspectAction(func(c *cli.Context, dp *dataplane.Dataplane, asJSON bool) error {
			var f inspect.FlowFilter
			f.Service = c.String("service")
			for _, a := range []struct {
				flag string
				dst  *netip.Addr
			}{{"client", &f.Client}, {"backend", &f.Backend}} {
				if v := c.String(a.flag); v != "" {
					ip, err := netip.ParseAddr(v)
					if err != nil || !ip.Is4() {
						return usageError("--%s %q: want an IPv4 address", a.flag, v)
					}
					*a.dst = ip
				}
			}
			if v := c.String("proto"); v != "" {
				p, err := inspect.ParseProto(v)
				if err != nil {
					return usageError("--proto %q: allowed values are tcp, udp", v)
				}
				f.Proto = p
			}
			flows, total, err := inspect.Conntrack(dp, f)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.App.Writer, struct {
					Total   int            `json:"total"`
					Matched int            `json:"matched"`
					Flows   []inspect.Flow `json:"flows"`
				}{total, len(flows), flows})
			}
			fmt.Fprintf(c.App.Writer, "%d flows tracked, %d shown\n", total, len(flows))
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

func lookupCommand() *cli.Command {
	return &cli.Command{
		Name:  "lookup",
		Usage: "which backend a new flow would get and why, and whether the flow is tracked now",
		Flags: []cli.Flag{bpffsFlag(), outputFlag(),
			&cli.StringFlag{Name: "proto", Value: "tcp", Usage: "tcp or udp"},
			&cli.StringFlag{Name: "src", Required: true, Usage: "client IP:PORT"},
			&cli.StringFlag{Name: "dst", Required: true, Usage: "frontend IP:PORT"},
		},
		Action: func(c *cli.Context) error {
			proto, err := inspect.ParseProto(c.String("proto"))
			if err != nil {
				return usageError("--proto %q: allowed values are tcp, udp", c.String("proto"))
			}
			src, err := inspect.ParseAddrPort(c.String("src"))
			if err != nil {
				return usageError("--src %v", err)
			}
			dst, err := inspect.ParseAddrPort(c.String("dst"))
			if err != nil {
				return usageError("--dst %v", err)
			}
			return inspectAction(func(c *cli.Context, dp *dataplane.Dataplane, asJSON bool) error {
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
					if l.SNAT {
						snat = " (SNAT to the node address)"
					}
					fmt.Fprintf(w, "backend:  %s%s\n", l.Backend, snat)
				}
				if l.TableSize > 0 {
					fmt.Fprintf(w, "maglev:   hash %#08x -> slot %d of %d -> backend id %d\n", l.Hash, l.Slot, l.TableSize, l.BackendID)
				}
				fmt.Fprintf(w, "why:      %s\n", l.Reason)
				if l.Tracked != nil {
					fmt.Fprintf(w, "tracked:  yes, to %s (%s)\n", l.Tracked.Backend, l.Tracked.State)
				} else {
					fmt.Fprintln(w, "tracked:  no")
				}
				return nil
			})(c)
		},
	}
}

func maglevCommand() *cli.Command {
	return &cli.Command{
		Name:      "maglev",
		Usage:     "a service port's Maglev table: slots per backend and balance",
		ArgsUsage: "SERVICE (namespace/name, or a service port key)",
		Flags:     []cli.Flag{bpffsFlag(), outputFlag()},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageError("maglev: want exactly one SERVICE argument (namespace/name)")
			}
			name := c.Args().First()
			return inspectAction(func(c *cli.Context, dp *dataplane.Dataplane, asJSON bool) error {
				reports, err := inspect.Tables(dp, name)
				if err != nil {
					return err
				}
				if len(reports) == 0 {
					return cli.Exit(fmt.Sprintf("no Maglev table for %q (unknown service, or no usable endpoints)", name), 1)
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
						fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f%%\t%s\n", b.Address, b.ID, b.Slots, 100*float64(b.Slots)/float64(r.Size), state)
					}
					tw.Flush()
				}
				return nil
			})(c)
		},
	}
}
