package dataplane

import (
	"errors"
	"fmt"
	"time"

	"github.com/xdplb/xdplb/xdp"
)

// AllowRouteReuse lets new flows reuse the route a new flow to the same
// backend found less than a second ago (xdp/include/route.h) until the
// datapath's clock (Now) reads until; 0 stops it at once. Only for a node
// that routes by destination alone: the agent checks and renews it.
func (d *Dataplane) AllowRouteReuse(until time.Duration) error {
	if d.m.RouteReuse == nil {
		return errNoRouteReuse
	}
	if until < 0 {
		until = 0
	}
	if err := d.m.RouteReuse.Put(uint32(0), xdp.RouteReuseLease{UntilNs: uint64(until)}); err != nil {
		return fmt.Errorf("write route reuse lease: %w", err)
	}
	return nil
}

// errNoRouteReuse: the datapath was pinned by a version without route reuse.
var errNoRouteReuse = errors.New("the pinned datapath has no route reuse lease (an earlier version)")

// RouteReuseAllowed reports whether new flows reuse routes now (never on
// a datapath pinned by a version without route reuse).
func (d *Dataplane) RouteReuseAllowed() (bool, error) {
	if d.m.RouteReuse == nil {
		return false, nil
	}
	var lease xdp.RouteReuseLease
	if err := d.m.RouteReuse.Lookup(uint32(0), &lease); err != nil {
		return false, fmt.Errorf("read route reuse lease: %w", err)
	}
	return time.Duration(lease.UntilNs) > Now(), nil
}
