package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

// snatSources are the addresses SNAT flows can leave with: every
// registered interface's address (a flow takes the address of the device
// towards its backend, or of the one it came in on) and the hairpin address.
func (d *Dataplane) snatSources() ([]netip.Addr, error) {
	var cfg xdp.NicDatapathConfig
	if err := d.m.Config.Lookup(uint32(0), &cfg); err != nil {
		return nil, fmt.Errorf("read datapath config: %w", err)
	}
	seen := map[netip.Addr]bool{}
	var out []netip.Addr
	add := func(raw uint32) {
		if raw == 0 {
			return
		}
		a := xdp.NetToAddr(raw)
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	add(cfg.HairpinAddr)
	var ifindex uint32
	var iface xdp.NicIface
	it := d.m.Ifaces.Iterate()
	for it.Next(&ifindex, &iface) {
		add(iface.Addr)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read interfaces: %w", err)
	}
	return out, nil
}

// ReleaseSNATHints clears the SNAT bucket hints that no backend in the
// backends map can use, and returns how many it cleared.
//
// A (backend, node address, protocol) keeps the bucket its first SNAT flow
// was given in snat_bucket_hints, which the datapath never clears: the
// backend's flows may outlive it for a while. Pods come and go with new
// addresses, so without this the hints of departed backends pile up, and
// a new backend whose hash meets one of them shares that bucket with
// whichever backend uses it now, where it would have had one of its own.
//
// Call it where backends are written (the datapath gives hints only to
// backends in the map, so none can get one meanwhile), after the flows
// of removed backends are gone or going: a flow of a departed backend that
// ends after this gives its triple a hint again, which the next call clears.
func (d *Dataplane) ReleaseSNATHints() (int, error) {
	backends, err := d.Backends()
	if err != nil {
		return 0, err
	}
	sources, err := d.snatSources()
	if err != nil {
		return 0, err
	}
	inUse := make([]bool, xdp.SNATBucketHints)
	for _, b := range backends {
		ap := netip.AddrPortFrom(b.Addr, b.Port)
		for _, src := range sources {
			inUse[xdp.SNATHint(ap, src, TCP)] = true
			inUse[xdp.SNATHint(ap, src, UDP)] = true
		}
	}

	keys := make([]uint32, xdp.SNATBucketHints)
	hints := make([]uint32, xdp.SNATBucketHints)
	var cursor ebpf.MapBatchCursor
	read := 0
	for read < len(keys) {
		n, err := d.m.SNATBucketHints.BatchLookup(&cursor, keys[read:], hints[read:], nil)
		read += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("read SNAT bucket hints: %w", err)
		}
	}
	cleared := 0
	for i := 0; i < read; i++ {
		index := keys[i]
		if index >= xdp.SNATBucketHints || hints[i] == 0 || inUse[index] {
			continue // SNATHintNext is the turn counter, not a hint
		}
		if err := d.m.SNATBucketHints.Put(index, uint32(0)); err != nil {
			return cleared, fmt.Errorf("clear SNAT bucket hint %d: %w", index, err)
		}
		cleared++
	}
	return cleared, nil
}
