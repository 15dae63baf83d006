// detach: remove the datapath from every interface and its pins.

package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/control/agent"
	"github.com/xdplb/xdplb/control/inspect"
	"github.com/xdplb/xdplb/loader"
)

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
