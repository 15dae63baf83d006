package dataplane

import (
	"fmt"

	"github.com/xdplb/xdplb/xdp"
)

// SetRouteByDestination tells the datapath whether this node routes by
// destination alone (no policy routing rules beyond the default ones, no
// multipath routes). While it does, a new flow may take the next hop a new
// flow to the same backend found less than a second ago instead of a FIB
// lookup of its own (xdp/include/route.h). It reports whether the setting
// changed.
func (d *Dataplane) SetRouteByDestination(on bool) (changed bool, err error) {
	d.configMu.Lock()
	defer d.configMu.Unlock()
	var cfg xdp.NicDatapathConfig
	if err := d.m.Config.Lookup(uint32(0), &cfg); err != nil {
		return false, fmt.Errorf("read datapath config: %w", err)
	}
	want := uint32(0)
	if on {
		want = 1
	}
	if cfg.RouteByDestination == want {
		return false, nil
	}
	cfg.RouteByDestination = want
	if err := d.m.Config.Put(uint32(0), cfg); err != nil {
		return false, fmt.Errorf("write datapath config: %w", err)
	}
	return true, nil
}
