package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

// snatSources are the addresses SNAT flows can leave with: towards a
// remote backend, the address of a registered interface (the one towards
// the backend, or the one the flow came in on) or one of extra; towards a
// local backend (a pod reaching itself through its service), the hairpin
// address.
func (d *Dataplane) snatSources(extra []netip.Addr) (remote []netip.Addr, hairpin netip.Addr, err error) {
	var cfg xdp.DatapathConfig
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
	var iface xdp.Iface
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

	hints, err := d.bucketHints()
	if err != nil {
		return 0, err
	}
	cleared := 0
	for index, hint := range hints {
		if hint == 0 || inUse[index] {
			continue
		}
		if err := d.m.SNATBucketHints.Put(uint32(index), uint32(0)); err != nil {
			return cleared, fmt.Errorf("clear SNAT bucket hint %d: %w", index, err)
		}
		cleared++
	}
	return cleared, nil
}

// TrustSNATSpillMarks tells the datapath that every spill in the NAT map
// is marked in its slot, if it finds that so, and reports whether the
// datapath trusts the marks now. It deletes the spills of flows that have
// ended on the way, and returns how many.
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
// Call it only when every program attached on this node is this
// datapath's (an older one would spill without marking). A spill that
// lacks a mark (an older version's, or one whose triple has no bucket
// hint) is deleted when its flow has ended: its forward entry is gone,
// expired, or answers to another reply tuple. One of a live flow keeps
// the marks untrusted; the datapath marks its slot at the flow's next
// check or reply (once a second while it has traffic), so a later call
// succeeds once every such flow has had a packet or ended.
func (d *Dataplane) TrustSNATSpillMarks() (trusted bool, deleted int, err error) {
	var cfg xdp.DatapathConfig
	if err := d.m.Config.Lookup(uint32(0), &cfg); err != nil {
		return false, 0, fmt.Errorf("read datapath config: %w", err)
	}
	if cfg.SnatSpillsMarked != 0 {
		return true, 0, nil
	}
	marked, deleted, err := d.settleSpills(cfg)
	if err != nil || !marked {
		return false, deleted, err
	}
	cfg.SnatSpillsMarked = 1
	if err := d.m.Config.Put(uint32(0), cfg); err != nil {
		return false, deleted, fmt.Errorf("write datapath config: %w", err)
	}
	return true, deleted, nil
}

// settleSpills deletes the unmarked spills of ended flows and reports
// whether every other spill has a marked slot.
func (d *Dataplane) settleSpills(cfg xdp.DatapathConfig) (marked bool, deleted int, err error) {
	hints, err := d.bucketHints()
	if err != nil {
		return false, 0, err
	}
	keys := make([]xdp.NatKey, flowBatch)
	entries := make([]xdp.NatEntry, flowBatch)
	markedSlots := map[uint32]bool{} // slot index -> marked, as read
	ports := xdp.SNATPortsOf(&cfg)
	// slotMarked reports whether a spill's slot is marked; false also for a
	// spill whose triple has no bucket (no slot to carry a mark).
	slotMarked := func(k xdp.NatKey, port uint16) (bool, error) {
		backend := netip.AddrPortFrom(xdp.NetToAddr(k.Saddr), xdp.NetToPort(k.Sport))
		bucket, ok := xdp.SNATHintBucket(hints[xdp.SNATHint(backend, xdp.NetToAddr(k.Daddr), k.Proto)], cfg.SnatBuckets)
		if !ok {
			return false, nil
		}
		index := xdp.SNATSlot(bucket, port, ports)
		if m, seen := markedSlots[index]; seen {
			return m, nil
		}
		var slot xdp.SnatSlot
		if err := d.m.SNATSlots.Lookup(index, &slot); err != nil {
			return false, fmt.Errorf("read SNAT slot %d: %w", index, err)
		}
		markedSlots[index] = slot.Flags&uint32(xdp.SnatSlotFlagsSNAT_SLOT_SPILLED) != 0
		return markedSlots[index], nil
	}
	marked = true
	var cursor ebpf.MapBatchCursor
	for {
		n, err := d.m.NAT.BatchLookup(&cursor, keys, entries, nil)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, deleted, fmt.Errorf("read NAT map: %w", err)
		}
		for i := range n {
			k, e := keys[i], entries[i]
			port := xdp.NetToPort(k.Dport)
			if e.Flags&uint8(xdp.CtFlagsCT_F_SNAT) == 0 || !ports.Contains(port) {
				continue
			}
			slotOK, err := slotMarked(k, port)
			if err != nil {
				return false, deleted, err
			}
			if slotOK {
				continue
			}
			ended, err := d.spillEnded(k, e, cfg)
			if err != nil {
				return false, deleted, err
			}
			if !ended {
				marked = false
				continue
			}
			gone, err := d.deleteSpill(k, e)
			if err != nil {
				return false, deleted, err
			}
			if gone {
				deleted++
			} else {
				marked = false // a new flow took the tuple over: look again next time
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
	}
	return marked, deleted, nil
}

// deleteSpill deletes an ended flow's spill if the entry is still that
// flow's: a claim may have taken the tuple over for a new flow since it
// was read. (Between this read and the delete a claim could still do so;
// the new flow's check then restores its reverse half within a second.)
// It reports whether the spill is gone.
func (d *Dataplane) deleteSpill(k xdp.NatKey, e xdp.NatEntry) (bool, error) {
	var now xdp.NatEntry
	switch err := d.m.NAT.Lookup(k, &now); {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("read NAT entry: %w", err)
	}
	if now.ClientAddr != e.ClientAddr || now.ClientPort != e.ClientPort ||
		now.FrontendAddr != e.FrontendAddr || now.FrontendPort != e.FrontendPort {
		return false, nil
	}
	if err := d.m.NAT.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, fmt.Errorf("delete ended spill: %w", err)
	}
	return true, nil
}

// spillEnded reports whether the flow of a spill has ended: its forward
// entry expired or translates to another reply tuple, or is gone and the
// flow is over by its reverse half (evictedFlowOver). (Should a late reply
// rebuild it meanwhile, the flow's next check restores the reverse half it
// loses when the spill is deleted.)
func (d *Dataplane) spillEnded(k xdp.NatKey, e xdp.NatEntry, cfg xdp.DatapathConfig) (bool, error) {
	owner := xdp.CtKey{Saddr: e.ClientAddr, Daddr: e.FrontendAddr, Sport: e.ClientPort, Dport: e.FrontendPort, Proto: k.Proto}
	var ct xdp.CtEntry
	found := false
	for _, t := range d.flowTables() {
		err := t.m.Lookup(owner, &ct)
		if err == nil {
			found = true
			break
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, fmt.Errorf("read %s entry: %w", t.name, err)
		}
	}
	if !found {
		return d.evictedFlowOver(k, e, cfg)
	}
	answers := ct.Flags&uint8(xdp.CtFlagsCT_F_SNAT) != 0 &&
		ct.BackendAddr == k.Saddr && ct.BackendPort == k.Sport && ct.NatAddr == k.Daddr && ct.NatPort == k.Dport
	return !answers || uint64(Now())-ct.LastSeenNs > ctTimeout(ct, k.Proto, cfg), nil
}

// UnconfirmedTCPTimeout is the idle timeout of an unconfirmed TCP flow
// at most (CT_UNCONFIRMED_TCP_TIMEOUT_NS in include/conntrack.h).
const UnconfirmedTCPTimeout = 5 * time.Second

// unconfirmedHold is how long an unconfirmed flow evicted from its table
// keeps its reply tuple (CT_UNCONFIRMED_HOLD_NS in include/halves.h).
const unconfirmedHold = uint64(2 * time.Second)

// evictedFlowOver reports whether a flow whose forward half is gone is
// over, by its reverse half (evicted_flow_alive in include/halves.h): its
// backend is gone, or the reverse half was idle past the flow's timeout
// (an unconfirmed flow's: at most unconfirmedHold). Until then its reply
// tuple stays its own.
func (d *Dataplane) evictedFlowOver(k xdp.NatKey, e xdp.NatEntry, cfg xdp.DatapathConfig) (bool, error) {
	var b xdp.Backend
	switch err := d.m.Backends.Lookup(e.BackendId, &b); {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("read backend %d: %w", e.BackendId, err)
	}
	if b.Addr != k.Saddr || b.Port != k.Sport {
		return true, nil
	}
	unconfirmed := e.Flags&uint8(xdp.CtFlagsCT_F_UNCONFIRMED) != 0
	timeout := cfg.UdpTimeoutNs
	switch {
	case k.Proto == TCP && unconfirmed:
		timeout = cfg.TcpTransientTimeoutNs
	case k.Proto == TCP:
		timeout = cfg.TcpEstablishedTimeoutNs
	}
	if unconfirmed {
		timeout = min(timeout, unconfirmedHold)
	}
	return uint64(Now())-e.LastSeenNs > timeout, nil
}

// ctTimeout is a conntrack entry's idle timeout (ct_timeout in
// include/conntrack.h).
func ctTimeout(ct xdp.CtEntry, proto uint8, cfg xdp.DatapathConfig) uint64 {
	if proto != TCP {
		return cfg.UdpTimeoutNs
	}
	if ct.Flags&uint8(xdp.CtFlagsCT_F_UNCONFIRMED) != 0 {
		return min(cfg.TcpTransientTimeoutNs, uint64(UnconfirmedTCPTimeout))
	}
	if TCPEstablished(ct.TcpState) {
		return cfg.TcpEstablishedTimeoutNs
	}
	return cfg.TcpTransientTimeoutNs
}

// bucketHints reads the whole snat_bucket_hints array (index: a triple's
// hint; value: its bucket + 1, or 0).
func (d *Dataplane) bucketHints() ([]uint32, error) {
	keys := make([]uint32, xdp.SNATBucketHints+1)
	values := make([]uint32, xdp.SNATBucketHints+1)
	hints := make([]uint32, xdp.SNATBucketHints)
	var cursor ebpf.MapBatchCursor
	read := 0
	for read < len(keys) {
		n, err := d.m.SNATBucketHints.BatchLookup(&cursor, keys[read:], values[read:], nil)
		read += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read SNAT bucket hints: %w", err)
		}
	}
	for i := 0; i < read; i++ {
		if keys[i] < xdp.SNATBucketHints {
			hints[keys[i]] = values[i]
		}
	}
	return hints, nil
}
