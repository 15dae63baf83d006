package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/testenv"
)

// routingNetns is a namespace with one device, 10.1.0.1/24 on eth0 (a
// veth whose peer is in the same namespace).
func routingNetns(t *testing.T) *testenv.Netns {
	t.Helper()
	ns := testenv.NewNetns(t, "rt")
	ns.IP("link", "add", "eth0", "type", "veth", "peer", "name", "eth0-peer")
	ns.IP("link", "set", "eth0", "up")
	ns.IP("link", "set", "eth0-peer", "up")
	ns.IP("addr", "add", "10.1.0.1/24", "dev", "eth0")
	return ns
}

func TestRoutingByDestination(t *testing.T) {
	cases := []struct {
		name  string
		setup [][]string // ip commands; {"sysctl", key, value} sets a sysctl
		want  bool
		why   string // part of the reason, when not
	}{
		{"fresh namespace", nil, true, ""},
		{"routes via gateways, one with a TOS", [][]string{
			{"route", "add", "10.2.0.0/16", "via", "10.1.0.2"},
			{"route", "add", "10.3.0.0/16", "tos", "0x10", "via", "10.1.0.3"},
		}, true, ""},
		{"rule by source", [][]string{{"rule", "add", "from", "10.9.0.0/16", "lookup", "100"}}, false, "4 policy routing rules"},
		{"rule by mark in place of main", [][]string{
			{"rule", "del", "priority", "32766"},
			{"rule", "add", "priority", "32766", "fwmark", "0x1", "lookup", "main"},
		}, false, "policy routing rule"},
		{"default table rule deleted", [][]string{{"rule", "del", "priority", "32767"}}, false, "2 policy routing rules"},
		{"multipath route", [][]string{
			{"route", "add", "10.4.0.0/16", "nexthop", "via", "10.1.0.2", "nexthop", "via", "10.1.0.3"},
		}, false, "10.4.0.0/16"},
		{"route to a nexthop group", [][]string{
			{"nexthop", "add", "id", "1", "via", "10.1.0.2", "dev", "eth0"},
			{"nexthop", "add", "id", "2", "via", "10.1.0.3", "dev", "eth0"},
			{"nexthop", "add", "id", "10", "group", "1/2"},
			{"route", "add", "10.5.0.0/16", "nhid", "10"},
		}, false, "10.5.0.0/16"},
		{"nexthop groups hidden", [][]string{{"sysctl", "net.ipv4.nexthop_compat_mode", "0"}}, false, "nexthop_compat_mode"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := routingNetns(t)
			for _, args := range tc.setup {
				if args[0] == "sysctl" {
					ns.Sysctl(args[1], args[2])
					continue
				}
				ns.IP(args...)
			}
			var ok bool
			var why string
			err := ns.Do(func() (err error) {
				ok, why, err = routingByDestination()
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.want || !strings.Contains(why, tc.why) {
				t.Fatalf("routingByDestination = %v, %q; want %v, a reason with %q", ok, why, tc.want, tc.why)
			}
		})
	}
}

// The agent lets the datapath reuse routes, or stops it, as the node's
// routing changes, told by the kernel (well within the periodic check),
// and stops it when its watch ends.
func TestRoutingWatchFollowsChanges(t *testing.T) {
	_, dp := loadSmallDatapath(t)
	defer dp.Close()
	ns := routingNetns(t)
	a := &Agent{log: discard(), plane: dataplane.New(&dp.Maps)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ns.Do(func() error { a.watchRouting(ctx); return nil }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	expect := func(want bool, after string) {
		t.Helper()
		deadline := time.Now().Add(routingCheckEvery / 3)
		for {
			got, err := a.plane.RouteReuseAllowed()
			if err != nil {
				t.Fatal(err)
			}
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("route reuse allowed = %v %s, want %v", got, after, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	expect(true, "at the start")
	ns.IP("rule", "add", "from", "10.9.0.0/16", "lookup", "100")
	expect(false, "after a rule was added")
	ns.IP("rule", "del", "from", "10.9.0.0/16", "lookup", "100")
	expect(true, "after the rule was deleted")
	ns.IP("route", "add", "10.4.0.0/16", "nexthop", "via", "10.1.0.2", "nexthop", "via", "10.1.0.3")
	expect(false, "after a multipath route was added")
	ns.IP("route", "del", "10.4.0.0/16")
	expect(true, "after the multipath route was deleted")

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil // for the deferred wait
	expect(false, "after the watch ended")
}
