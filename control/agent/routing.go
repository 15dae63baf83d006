package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

const (
	// routingCheckEvery is how often the agent checks the node's routing
	// without being told of a change (a backstop for lost notifications).
	routingCheckEvery = 30 * time.Second
	// routingCheckAfter is how long a check waits after a routing change,
	// so a burst of route updates (a routing daemon's) costs one check.
	routingCheckAfter = 200 * time.Millisecond
)

// defaultRules are the IPv4 policy routing rules of a fresh network
// namespace (priority to table): local, main, default.
var defaultRules = map[int]int{0: unix.RT_TABLE_LOCAL, 32766: unix.RT_TABLE_MAIN, 32767: unix.RT_TABLE_DEFAULT}

// routingByDestination reports whether this network namespace routes IPv4
// by destination alone: its policy rules are the default ones, without
// selectors, and no route has more than one next hop (a multipath route,
// or a route to a nexthop group, which the kernel lists as one while
// net.ipv4.nexthop_compat_mode is on, its default). When it does not, why
// says what makes the route depend on more than the destination.
func routingByDestination() (ok bool, why string, err error) {
	rules, err := netlink.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return false, "", fmt.Errorf("list policy routing rules: %w", err)
	}
	if len(rules) != len(defaultRules) {
		return false, fmt.Sprintf("%d policy routing rules (the default: %d)", len(rules), len(defaultRules)), nil
	}
	for _, r := range rules {
		if table, ok := defaultRules[r.Priority]; !ok || r.Table != table || ruleHasSelector(r) {
			return false, fmt.Sprintf("policy routing rule %s", r), nil
		}
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC},
		netlink.RT_FILTER_TABLE)
	if err != nil {
		return false, "", fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if len(r.MultiPath) > 0 {
			return false, fmt.Sprintf("route to %s in table %d has more than one next hop", routeDst(r), r.Table), nil
		}
	}
	return true, "", nil
}

// ruleHasSelector reports whether a rule matches on more than its
// priority (the default rules match every packet).
func ruleHasSelector(r netlink.Rule) bool {
	return r.Src != nil || r.Dst != nil || r.IifName != "" || r.OifName != "" || r.Mark != 0 ||
		r.Mask != nil || r.Tos != 0 || r.TunID != 0 || r.Invert || r.Dport != nil || r.Sport != nil ||
		r.IPProto != 0 || r.UIDRange != nil || r.Goto > 0 || r.SuppressPrefixlen > 0 || r.SuppressIfgroup > 0
}

func routeDst(r netlink.Route) string {
	if r.Dst == nil {
		return "default"
	}
	return r.Dst.String()
}

// watchRouting keeps the datapath's route_by_destination switch (see
// dataplane.SetRouteByDestination) in step with the node's routing: checked
// at the start, after every change of IPv4 routes or policy rules the
// kernel announces, and every routingCheckEvery. It turns the switch off
// when it ends: with no agent watching, nothing would notice a change.
func (a *Agent) watchRouting(ctx context.Context) {
	defer func() {
		if _, err := a.plane.SetRouteByDestination(false); err != nil {
			a.log.Warn("turn route reuse off", "error", err)
		}
	}()
	changes := make(chan struct{}, 1)
	sock, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV4_RULE)
	if err != nil {
		a.log.Warn("cannot watch routing changes; checked periodically only", "every", routingCheckEvery, "error", err)
	} else {
		defer sock.Close()
		go a.readRoutingChanges(ctx, sock, changes)
	}
	tick := time.NewTicker(routingCheckEvery)
	defer tick.Stop()
	for first := true; ; first = false {
		a.checkRouting(first)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-changes:
			select {
			case <-ctx.Done():
				return
			case <-time.After(routingCheckAfter):
			}
			// Changes that came meanwhile are in this check.
			select {
			case <-changes:
			default:
			}
		}
	}
}

// readRoutingChanges signals changes (without blocking) for every batch of
// routing notifications until the socket is closed. A receive buffer that
// overflowed (ENOBUFS) lost notifications: a change too.
func (a *Agent) readRoutingChanges(ctx context.Context, sock *nl.NetlinkSocket, changes chan<- struct{}) {
	for {
		if _, _, err := sock.Receive(); err != nil && !errors.Is(err, unix.ENOBUFS) {
			if ctx.Err() == nil && !errors.Is(err, os.ErrClosed) {
				a.log.Warn("routing watch ended; checked periodically only", "every", routingCheckEvery, "error", err)
			}
			return
		}
		select {
		case changes <- struct{}{}:
		default:
		}
	}
}

// checkRouting runs one check and sets the datapath's switch from it,
// saying so when it changed (or always, with report).
func (a *Agent) checkRouting(report bool) {
	defer a.routingChecks.Add(1)
	ok, why, err := routingByDestination()
	if err != nil {
		// Unknown: the safe side is a FIB lookup for every new flow.
		ok, why = false, err.Error()
	}
	changed, err := a.plane.SetRouteByDestination(ok)
	switch {
	case err != nil:
		a.log.Warn("set route_by_destination", "error", err)
	case !changed && !report:
	case ok:
		a.log.Info("routing depends on the destination alone: new flows reuse their backend's route for up to a second")
	default:
		a.log.Info("routing depends on more than the destination: every new flow is routed by a FIB lookup", "reason", why)
	}
}
