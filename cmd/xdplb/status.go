// status: the agent, the datapath's settings and counters, from the pins.

package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/inspect"
	"github.com/xdplb/xdplb/loader"
)

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
