package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

// snatSources are the addresses SNAT flows can leave with: towards a
// remote backend, the address of a registered interface (the one towards
// the backend, or the one the flow came in on) or one of extra; towards a
// local backend (a pod reaching itself through its service), the hairpin
// address.
func (d *Dataplane) snatSources(extra []netip.Addr) (remote []netip.Addr, hairpin netip.Addr, err error) {
	var cfg xdp.NicDatapathConfig
	if err := d.m.Config.Lookup(uint32(0), &cfg); err != nil {
		return nil, hairpin, fmt.Errorf("read datapath config: %w", err)
	}
	seen := map[netip.Addr]bool{}
	add := func(a netip.Addr) {
		if a.Is4() && !a.IsUnspecified() && !seen[a] {
			seen[a] = true
			remote = append(remote, a)
		}
	}
	var ifindex uint32
	var iface xdp.NicIface
	it := d.m.Ifaces.Iterate()
	for it.Next(&ifindex, &iface) {
		add(xdp.NetToAddr(iface.Addr))
	}
	if err := it.Err(); err != nil {
		return nil, hairpin, fmt.Errorf("read interfaces: %w", err)
	}
	for _, a := range extra {
		add(a)
	}
	return remote, xdp.NetToAddr(cfg.HairpinAddr), nil
}

// ReleaseSNATHints clears the SNAT bucket hints that none of backends
// (what the backends map holds) can use, and returns how many it cleared.
// extra are addresses SNAT flows may still leave with besides those of
// the registered interfaces (an interface's other addresses: a flow keeps
// the address it started with when the interface's first one changes).
//
// A (backend, node address, protocol) keeps the bucket its first SNAT flow
// was given in snat_bucket_hints, which the datapath never clears: the
// backend's flows may outlive it for a while. Pods come and go with new
// addresses, so without this the hints of departed backends pile up, and
// a new backend whose hash meets one of them shares that bucket with
// whichever backend uses it now, where it would have had one of its own.
// A hint some current backend's triple hashes to stays, whether or not
// that triple has flows (the protocols a backend serves are not in the
// map, so both count).
//
// Call it where backends are written, so no backend can be added
// meanwhile, with the backends the writer knows it wrote (reading them
// back from the map took 25 of a sweep's 27 ms with 50k backends in a map
// of 262144; without that a sweep takes ~1.2 ms), and once the flows of
// removed backends have ended: a flow of a departed backend that ends in
// the datapath later gives its triple a hint again (releasing a port
// takes the lock of its slot, found through the hint), which stays until
// the next call.
func (d *Dataplane) ReleaseSNATHints(backends map[uint32]Backend, extra []netip.Addr) (int, error) {
	remote, hairpin, err := d.snatSources(extra)
	if err != nil {
		return 0, err
	}
	inUse := make([]bool, xdp.SNATBucketHints)
	mark := func(backend netip.AddrPort, src netip.Addr) {
		inUse[xdp.SNATHint(backend, src, TCP)] = true
		inUse[xdp.SNATHint(backend, src, UDP)] = true
	}
	for _, b := range backends {
		ap := netip.AddrPortFrom(b.Addr, b.Port)
		if b.Local {
			mark(ap, hairpin)
			continue
		}
		for _, src := range remote {
			mark(ap, src)
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

// TrustSNATSpillMarks tells the datapath that every spill in the NAT map
// is marked in its slot, if it finds that so, and reports whether the
// datapath trusts the marks now.
//
// A spill is a SNAT reply tuple kept in the NAT map although it has a
// slot: its slot held another backend's tuple (backends share a bucket).
// A SNAT claim must not give a backend a port it already holds there, so
// it used to look every port up in the NAT map, a cold lookup on every
// new flow. The datapath marks a slot before it spills one of its tuples
// (SNAT_SLOT_SPILLED), and once it trusts the marks it looks up only the
// ports of marked slots. Until then it looks them all up: a datapath
// loaded over pinned maps may find spills an older version made without
// marking them, and the loader starts every datapath untrusting.
//
// Call it once no older datapath runs on this node any more (every
// program it attached was replaced). A spill whose triple has no bucket
// hint, or whose slot has no mark, keeps the marks untrusted; it goes
// when its flow ends or the LRU evicts it, and a later call succeeds.
func (d *Dataplane) TrustSNATSpillMarks() (bool, error) {
	var cfg xdp.NicDatapathConfig
	if err := d.m.Config.Lookup(uint32(0), &cfg); err != nil {
		return false, fmt.Errorf("read datapath config: %w", err)
	}
	if cfg.SnatSpillsMarked != 0 {
		return true, nil
	}
	marked, err := d.spillsMarked(cfg)
	if err != nil || !marked {
		return false, err
	}
	cfg.SnatSpillsMarked = 1
	if err := d.m.Config.Put(uint32(0), cfg); err != nil {
		return false, fmt.Errorf("write datapath config: %w", err)
	}
	return true, nil
}

// spillsMarked reports whether every spill in the NAT map has a bucket
// and a marked slot, stopping at the first that has not.
func (d *Dataplane) spillsMarked(cfg xdp.NicDatapathConfig) (bool, error) {
	keys := make([]xdp.NicNatKey, flowBatch)
	entries := make([]xdp.NicNatEntry, flowBatch)
	checked := map[uint32]bool{} // slot indices seen marked
	var cursor ebpf.MapBatchCursor
	for {
		n, err := d.m.NAT.BatchLookup(&cursor, keys, entries, nil)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, fmt.Errorf("read NAT map: %w", err)
		}
		for i := range n {
			k := keys[i]
			port := xdp.NetToPort(k.Dport)
			if entries[i].Flags&uint8(xdp.NicCtFlagsCT_F_SNAT) == 0 ||
				port < cfg.SnatPortMin || port > cfg.SnatPortMax {
				continue
			}
			backend := netip.AddrPortFrom(xdp.NetToAddr(k.Saddr), xdp.NetToPort(k.Sport))
			var hint uint32
			if err := d.m.SNATBucketHints.Lookup(xdp.SNATHint(backend, xdp.NetToAddr(k.Daddr), k.Proto), &hint); err != nil {
				return false, fmt.Errorf("read SNAT bucket hint: %w", err)
			}
			bucket, ok := xdp.SNATHintBucket(hint, cfg.SnatBuckets)
			if !ok {
				return false, nil
			}
			index := xdp.SNATSlot(bucket, port, cfg.SnatPortMin, cfg.SnatPortMax)
			if checked[index] {
				continue
			}
			var slot xdp.NicSnatSlot
			if err := d.m.SNATSlots.Lookup(index, &slot); err != nil {
				return false, fmt.Errorf("read SNAT slot %d: %w", index, err)
			}
			if slot.Flags&uint32(xdp.NicSnatSlotFlagsSNAT_SLOT_SPILLED) == 0 {
				return false, nil
			}
			checked[index] = true
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return true, nil
		}
	}
}
