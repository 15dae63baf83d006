package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/control/dataplane"
)

const (
	// routingCheckEvery is how often the agent checks the node's routing
	// without being told of a change (a backstop for lost notifications),
	// renewing the route reuse lease.
	routingCheckEvery = 30 * time.Second
	// routeReuseLease is how long one check lets new flows reuse routes:
	// an agent that dies without ending the lease stops it this long
	// after its last check.
	routeReuseLease = 3 * routingCheckEvery
	// routingCheckAfter is how long a check waits after a routing change,
	// so a burst of route updates (a routing daemon's) costs one check;
	// routingCheckSpacing is the least time between two checks.
	routingCheckAfter   = 200 * time.Millisecond
	routingCheckSpacing = time.Second
	// routeDumpTries bounds the retries of a route dump that a concurrent
	// change interrupted.
	routeDumpTries = 3
)

// defaultRules are the IPv4 policy routing rules of a fresh network
// namespace (priority to table): local, main, default.
var defaultRules = map[int]int{0: unix.RT_TABLE_LOCAL, 32766: unix.RT_TABLE_MAIN, 32767: unix.RT_TABLE_DEFAULT}

// nexthopCompatMode is the sysctl that makes the kernel list a route to a
// nexthop group with its next hops, and announce changes of the group as
// route changes.
const nexthopCompatMode = "/proc/sys/net/ipv4/nexthop_compat_mode"

// routingByDestination reports whether this network namespace routes IPv4
// by destination alone: its policy rules are the default ones, without
// selectors, and no route has more than one next hop (a multipath route,
// or a route to a nexthop group, which the kernel lists as one while
// net.ipv4.nexthop_compat_mode is on, its default; with it off, routes to
// groups cannot be told apart, and the answer is no). When it does not,
// why says what makes the route depend on more than the destination.
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
	if mode, err := os.ReadFile(nexthopCompatMode); err == nil && strings.TrimSpace(string(mode)) == "0" {
		return false, "net.ipv4.nexthop_compat_mode is 0: routes to nexthop groups do not show their next hops", nil
	}
	for try := 1; ; try++ {
		why = ""
		err = netlink.RouteListFilteredIter(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_TABLE, func(r netlink.Route) bool {
				if len(r.MultiPath) > 0 {
					why = fmt.Sprintf("route to %s in table %d has more than one next hop", routeDst(r), r.Table)
					return false
				}
				return true
			})
		if errors.Is(err, netlink.ErrDumpInterrupted) && try < routeDumpTries {
			continue
		}
		if err != nil {
			return false, "", fmt.Errorf("list routes: %w", err)
		}
		return why == "", why, nil
	}
}

// ruleHasSelector reports whether a rule matches on more than its
// priority (the default rules match every packet). The library marks an
// unset suppressor with -1.
func ruleHasSelector(r netlink.Rule) bool {
	return r.Src != nil || r.Dst != nil || r.IifName != "" || r.OifName != "" || r.Mark != 0 ||
		r.Mask != nil || r.Tos != 0 || r.TunID != 0 || r.Invert || r.Dport != nil || r.Sport != nil ||
		r.IPProto != 0 || r.UIDRange != nil || r.Goto > 0 || r.SuppressPrefixlen >= 0 || r.SuppressIfgroup >= 0
}

func routeDst(r netlink.Route) string {
	if r.Dst == nil {
		return "default"
	}
	return r.Dst.String()
}

// watchRouting lets new flows reuse their backend's route (see
// dataplane.AllowRouteReuse) while the node routes by destination alone:
// checked at the start, after every change of IPv4 routes or policy rules
// the kernel announces, and every routingCheckEvery, each check renewing
// the lease or ending it. It ends the lease when it returns: with no agent
// watching, nothing would notice a change.
func (a *Agent) watchRouting(ctx context.Context) {
	defer func() {
		if err := a.plane.AllowRouteReuse(0); err != nil {
			a.log.Warn("end route reuse", "error", err)
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
	var last time.Time
	reusing := false
	for first := true; ; first = false {
		reusing = a.checkRouting(reusing, first)
		last = time.Now()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-changes:
			wait := max(routingCheckAfter, time.Until(last.Add(routingCheckSpacing)))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
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
			if ctx.Err() == nil {
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

// checkRouting runs one check, renews or ends the lease, and says so when
// the answer differs from the previous one (reusing), or always with
// report. It returns whether new flows reuse routes now.
func (a *Agent) checkRouting(reusing, report bool) bool {
	ok, why, err := routingByDestination()
	if err != nil {
		// Unknown: the safe side is a FIB lookup for every new flow.
		ok, why = false, err.Error()
	}
	until := time.Duration(0)
	if ok {
		until = dataplane.Now() + routeReuseLease
	}
	if err := a.plane.AllowRouteReuse(until); err != nil {
		a.log.Warn("write route reuse lease", "error", err)
		return reusing
	}
	switch {
	case ok == reusing && !report:
	case ok:
		a.log.Info("routing depends on the destination alone: new flows reuse their backend's route for up to a second")
	default:
		a.log.Info("routing depends on more than the destination: every new flow is routed by a FIB lookup", "reason", why)
	}
	return ok
}
