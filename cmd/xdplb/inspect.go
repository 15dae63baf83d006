package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/control/agent"
	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/inspect"
	"github.com/xdplb/xdplb/loader"
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

func detachCommand() *cli.Command {
	return &cli.Command{
		Name:  "detach",
		Usage: "detach the datapath from every interface and remove its pins (flows are forgotten)",
		Flags: []cli.Flag{bpffsFlag(), hostProcSysFlag(),
			&cli.BoolFlag{Name: "force", Usage: "detach even while an agent runs on these pins (it would serve nothing and still report healthy)"}},
		Action: func(c *cli.Context) error {
			// A signal does not stop a detach half-way; a second one does.
			_, stop := untilSignalled(c.Context)
			defer stop()
			root, err := pinRoot(c)
			if err != nil {
				return err
			}
			if err := noArgs(c); err != nil {
				return err
			}
			procSys, err := hostProcSys(c)
			if err != nil {
				return err
			}
			// Nothing pinned, nothing to detach (cleanup scripts may
			// run it twice). Nothing is touched: the TC filters of the
			// clsact fallback carry the same names under every pin root,
			// and those of an agent on another root must stay.
			if loader.CheckPinned(root) != nil {
				if others := loader.OtherSchemaVersions(root); len(others) > 0 {
					return fmt.Errorf("nothing pinned under %s by this version (schema %s), but pins of schema %s are: "+
						"detach them with the xdplb that pinned them", root, loader.SchemaVersion, strings.Join(others, ", "))
				}
				fmt.Fprintf(c.App.Writer, "nothing pinned under %s: nothing to detach\n", root)
				return nil
			}
			// The lock the agent holds while it runs, from before it
			// loads anything (also while it waits for its first sync),
			// is held here until the pins are gone: no agent starts on
			// them meanwhile. The pid an agent records is checked too.
			lock, err := loader.TryLockPins(root)
			var busy *loader.PinsInUseError
			switch {
			case errors.As(err, &busy):
				if !c.Bool("force") {
					return agentRunsError(root, busy.PID)
				}
			case err != nil:
				return err
			}
			defer lock.Unlock()
			if pid := inspect.RunningAgent(root); pid != 0 && !c.Bool("force") {
				return agentRunsError(root, int(pid))
			}
			links, err := inspect.LinkNames(root)
			if err != nil {
				return err
			}
			// Before the pins go: the record of which ports the agent
			// reserved is one of them. A failure to release them does
			// not stop the detach; it is reported at the end.
			released, releaseErr := agent.ReleaseSNATPorts(root, procSys)
			if err := loader.Detach(root); err != nil {
				return errors.Join(err, releaseErr)
			}
			for _, a := range links {
				if a.Hook == loader.HookCgroup {
					fmt.Fprintf(c.App.Writer, "detached cgroup %s from the host's sockets\n", a.Mode)
					continue
				}
				fmt.Fprintf(c.App.Writer, "detached %s from %s\n", a.Hook, a.Interface)
			}
			if released != "" {
				fmt.Fprintf(c.App.Writer, "released ports %s from net.ipv4.ip_local_reserved_ports\n", released)
			}
			fmt.Fprintln(c.App.Writer, "pins removed from", loader.Dir(root))
			return releaseErr
		},
	}
}

// agentRunsError refuses to detach under a running agent (pid 0: not
// visible from here).
func agentRunsError(root string, pid int) error {
	agent := "an agent"
	if pid != 0 {
		agent = fmt.Sprintf("an agent (pid %d)", pid)
	}
	return fmt.Errorf("%s runs on the pins under %s: stop it first (in a DaemonSet: delete the DaemonSet, or keep it off the node; a deleted pod comes back), or pass --force", agent, root)
}

// statusJSON is the status with what the pin lock adds.
type statusJSON struct {
	inspect.Status
	// AgentStarting: an agent runs (holds the pins' lock) and has not
	// synced yet.
	AgentStarting bool `json:"agentStarting"`
}

// agentStatus completes the status with the pins' lock: an agent holds it
// while it runs, from before it loads anything, so it runs even if it has
// not recorded itself yet (that waits for the load), and it is starting
// until its first sync.
func agentStatus(root string, st inspect.Status) (statusJSON, error) {
	held, holder, err := loader.PinsLocked(root)
	if err != nil {
		return statusJSON{Status: st}, err
	}
	return withLockHolder(st, held, holder), nil
}

// withLockHolder is agentStatus's verdict, given whether the lock is held
// and by which pid (0: not visible from here).
func withLockHolder(st inspect.Status, held bool, holder int) statusJSON {
	if !held {
		return statusJSON{Status: st}
	}
	// A holder this process cannot see (an agent in a pod's pid namespace,
	// status run from another) is taken to be the one the record names: an
	// agent records itself as soon as it has loaded the datapath.
	if own := holder == 0 || st.AgentAlive && int(st.AgentPID) == holder; !own {
		// The record is an earlier agent's.
		st.AgentPID, st.Started, st.LastSync = uint32(holder), nil, nil
		st.Syncs, st.Services, st.Problems = 0, 0, 0
	}
	st.AgentAlive = true
	return statusJSON{Status: st, AgentStarting: st.LastSync == nil}
}

// agentLine is the status's Agent line.
func agentLine(st statusJSON) string {
	if st.AgentPID == 0 {
		if st.AgentAlive {
			return "running (pid not visible from here)" + startingNote(st)
		}
		return "never ran"
	}
	state := "not running"
	if st.AgentAlive {
		state = "running" + startingNote(st)
	}
	line := fmt.Sprintf("pid %d (%s)", st.AgentPID, state)
	if st.Started != nil {
		line += ", started " + st.Started.UTC().Format(time.RFC3339)
	}
	return line
}

func startingNote(st statusJSON) string {
	if st.AgentStarting {
		return ", starting: no sync yet"
	}
	return ""
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:   "status",
		Usage:  "interfaces and programs, map occupancy, the agent's last sync, counters",
		Flags:  []cli.Flag{bpffsFlag(), outputFlag()},
		Action: startingWithoutPins(statusAction()),
	}
}

// startingWithoutPins adds to a failure of action that an agent holds the
// pins' lock: one that has not pinned its maps yet (a first start) is
// running all the same.
func startingWithoutPins(action cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		err := action(c)
		var usage cli.ExitCoder
		if err == nil || errors.As(err, &usage) {
			return err
		}
		if held, pid, lerr := loader.PinsLocked(c.String("bpffs-root")); lerr == nil && held {
			holder := "an agent"
			if pid != 0 {
				holder = fmt.Sprintf("an agent (pid %d)", pid)
			}
			return fmt.Errorf("%w; %s holds the lock on these pins: it is starting", err, holder)
		}
		return err
	}
}

func statusAction() cli.ActionFunc {
	return inspectAction(nil, func(c *cli.Context, root string, dp *dataplane.Dataplane, asJSON bool) error {
		raw, err := inspect.GetStatus(root, dp)
		if err != nil {
			return err
		}
		st, err := agentStatus(root, raw)
		if err != nil {
			return err
		}
		if asJSON {
			return writeJSON(c.App.Writer, st)
		}
		w := c.App.Writer
		fmt.Fprintf(w, "Pins:      %s\n", st.PinDir)
		fmt.Fprintf(w, "Agent:     %s\n", agentLine(st))
		if st.LastSync != nil {
			fmt.Fprintf(w, "Last sync: %s (%s ago), %s, %s, %s\n",
				st.LastSync.UTC().Format(time.RFC3339), time.Since(*st.LastSync).Round(time.Second),
				plural(st.Syncs, "sync", "syncs"), plural(uint64(st.Services), "service port", "service ports"),
				plural(uint64(st.Problems), "problem", "problems"))
		}
		d := st.Datapath
		fmt.Fprintf(w, "Datapath:  hash seed %#x, SNAT ports %s, idle timeouts: TCP established %s, TCP transient %s, UDP %s\n",
			d.HashSeed, d.SNATPorts, d.TCPEstablishedTimeout, d.TCPTransientTimeout, d.UDPTimeout)
		icmp := "not limited"
		if d.ICMPErrorInterval != "none" {
			icmp = fmt.Sprintf("one per %s and CPU after a burst of %d", d.ICMPErrorInterval, loader.ICMPErrorBurst)
		}
		fmt.Fprintf(w, "ICMP:      port unreachables the datapath sends: %s\n", icmp)
		routes := "every new flow is routed by a FIB lookup"
		if d.NewFlowRouteReuse {
			routes = "new flows reuse their backend's route for up to a second (the agent found that the node routes by destination alone)"
		}
		fmt.Fprintf(w, "Routes:    %s\n", routes)
		fmt.Fprintf(w, "SYN:       %s\n", synCookiesLine(d, st.SYNCookiePorts))
		if fl := st.Flood; fl != nil {
			var ports []string
			for _, p := range fl.Ports {
				ports = append(ports, fmt.Sprintf("%s %d", p.Service, p.Unconfirmed))
			}
			fmt.Fprintf(w, "Flood:     ct_unconfirmed %.0f%% full: new flows displace each other (confirmed flows are kept); unconfirmed flows: %s\n",
				fl.Percent, strings.Join(ports, ", "))
		}
		fmt.Fprintln(w)
		tw := table(w)
		fmt.Fprintln(tw, "INTERFACE\tHOOK\tMODE\tPROGRAM\tID\tBUILD")
		for _, a := range st.Attachments {
			build := "this binary"
			if !a.ThisBuild {
				build = "another build"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", a.Interface, a.Hook, a.Mode, a.Program, a.ProgramID, build)
		}
		if len(st.Attachments) == 0 {
			fmt.Fprintln(tw, "(none)\t\t\t\t\t")
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
	})
}

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

// synCookiesLine says when SYNs are answered with SYN cookies, and for
// which service ports they are now.
func synCookiesLine(d inspect.Settings, ports []string) string {
	switch d.SYNCookies {
	case "auto":
		line := fmt.Sprintf("SYN cookies for a service port that leaves %d handshakes incomplete within a second", d.SYNFloodThreshold)
		if len(ports) == 0 {
			return line + "; none now"
		}
		return line + "; now: " + strings.Join(ports, ", ")
	case "always":
		return "SYN cookies answer every SYN to an external frontend (but for host-network backends)"
	default:
		return "no SYN cookies"
	}
}
