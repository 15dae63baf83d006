package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/testenv"
)

// A second agent on the same pins fails before it loads or attaches
// anything: the first keeps its interface, the second's is left alone.
// Once the first stops, the lock is free for the next one. A started
// agent records its pid at once, not at its first sync.
func TestSecondAgentOnThePinsFails(t *testing.T) {
	ns := testenv.NewNetns(t, "lock")
	for _, name := range []string{"edge0", "edge2"} {
		peer := "peer" + strings.TrimPrefix(name, "edge")
		ns.IP("link", "add", name, "type", "veth", "peer", "name", peer)
		ns.IP("link", "set", name, "up")
		ns.IP("link", "set", peer, "up")
	}
	cfg := fileConfig(t, "edge0")
	opts := cfg.Datapath
	xdpProg := func(name string) uint32 {
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if x := l.Attrs().Xdp; x != nil && x.Attached {
			return x.ProgId
		}
		return 0
	}
	err := ns.Do(func() error {
		first, err := Start(context.Background(), cfg, discard())
		if err != nil {
			return fmt.Errorf("first agent: %w", err)
		}
		as, err := first.plane.AgentState()
		if err != nil || as.PID != uint32(os.Getpid()) || as.Syncs != 0 || as.Started.IsZero() {
			first.Close()
			return fmt.Errorf("after Start the agent state is %+v (%v); want this pid, started, no syncs", as, err)
		}
		prog := xdpProg("edge0")

		second := cfg
		second.Interfaces = []string{"edge2"}
		a, err := Start(context.Background(), second, discard())
		var busy *loader.PinsInUseError
		if !errors.As(err, &busy) || busy.PID != os.Getpid() {
			if a != nil {
				a.Close()
			}
			first.Close()
			return fmt.Errorf("second agent on the same pins: %v; want a PinsInUseError naming pid %d", err, os.Getpid())
		}
		if got := xdpProg("edge0"); got != prog || got == 0 {
			t.Errorf("the second agent changed the first one's edge0: XDP program %d, was %d", got, prog)
		}
		if got := xdpProg("edge2"); got != 0 {
			t.Errorf("the second agent attached edge2 (XDP program %d)", got)
		}
		if !loader.NICAttached(opts.PinRoot, "edge0") {
			t.Error("the first agent's edge0 links are no longer pinned")
		}

		first.Close()
		a, err = Start(context.Background(), second, discard())
		if err != nil {
			return fmt.Errorf("an agent after the first stopped: %w", err)
		}
		a.Close()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
