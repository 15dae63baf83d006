package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/xdp"
)

// Flow is a tracked flow: the client-side tuple and what it is translated to.
type Flow struct {
	Client    netip.AddrPort
	Frontend  netip.AddrPort
	Proto     uint8
	BackendID uint32
	Backend   netip.AddrPort
	SvcID     uint32
	NAT       netip.AddrPort // SNAT source; invalid when the flow is not SNATed
	TCPState  uint8          // enum ct_tcp_state bits
	External  bool
	// Unconfirmed: not confirmed yet (a TCP handshake not complete both
	// ways, a UDP flow never answered), kept in the table of such flows.
	Unconfirmed bool
	Ended       bool          // ended by DeleteFlow, dated past every timeout
	Created     time.Duration // CLOCK_MONOTONIC timestamps, as the kernel keeps them
	LastSeen    time.Duration
}

// FlowKey identifies a flow by its client-side tuple.
type FlowKey struct {
	Client   netip.AddrPort
	Frontend netip.AddrPort
	Proto    uint8
}

func (k FlowKey) raw() xdp.CtKey {
	return xdp.CtKey{
		Saddr: xdp.AddrToNet(k.Client.Addr()), Sport: xdp.PortToNet(k.Client.Port()),
		Daddr: xdp.AddrToNet(k.Frontend.Addr()), Dport: xdp.PortToNet(k.Frontend.Port()),
		Proto: k.Proto,
	}
}

func flowOf(k xdp.CtKey, v xdp.CtEntry) Flow {
	f := Flow{
		Client:      netip.AddrPortFrom(xdp.NetToAddr(k.Saddr), xdp.NetToPort(k.Sport)),
		Frontend:    netip.AddrPortFrom(xdp.NetToAddr(k.Daddr), xdp.NetToPort(k.Dport)),
		Proto:       k.Proto,
		BackendID:   v.BackendId,
		Backend:     netip.AddrPortFrom(xdp.NetToAddr(v.BackendAddr), xdp.NetToPort(v.BackendPort)),
		SvcID:       v.SvcId,
		TCPState:    v.TcpState,
		External:    v.Flags&uint8(xdp.CtFlagsCT_F_EXTERNAL) != 0,
		Ended:       v.Flags&uint8(xdp.CtFlagsCT_F_ENDED) != 0,
		Unconfirmed: v.Flags&uint8(xdp.CtFlagsCT_F_UNCONFIRMED) != 0,
		Created:     time.Duration(v.CreatedNs),
		LastSeen:    time.Duration(v.LastSeenNs),
	}
	if v.Flags&uint8(xdp.CtFlagsCT_F_SNAT) != 0 {
		f.NAT = netip.AddrPortFrom(xdp.NetToAddr(v.NatAddr), xdp.NetToPort(v.NatPort))
	}
	return f
}

// Key returns the flow's key.
func (f Flow) Key() FlowKey { return FlowKey{Client: f.Client, Frontend: f.Frontend, Proto: f.Proto} }

// flowTable is a map of forward halves, by its C name: confirmed flows, or
// those not confirmed yet.
type flowTable struct {
	name string
	m    *ebpf.Map
}

// flowTables are the maps of forward halves, confirmed flows first (the
// order the datapath looks them up in). A datapath pinned by an earlier
// version has no table of unconfirmed flows.
func (d *Dataplane) flowTables() []flowTable {
	tables := []flowTable{{"conntrack", d.m.Conntrack}}
	if d.m.CtUnconfirmed != nil {
		tables = append(tables, flowTable{"ct_unconfirmed", d.m.CtUnconfirmed})
	}
	return tables
}

// Flows calls fn for every tracked flow, confirmed ones first, until fn
// returns false.
func (d *Dataplane) Flows(fn func(Flow) bool) error {
	stopped := false
	for _, t := range d.flowTables() {
		err := eachEntry(t.m, func(k xdp.CtKey, v xdp.CtEntry) bool {
			stopped = !fn(flowOf(k, v))
			return !stopped
		})
		if err != nil {
			return fmt.Errorf("read %s: %w", t.name, err)
		}
		if stopped {
			return nil
		}
	}
	return nil
}

// eachEntry calls fn for every entry of a hash map until it returns
// false, reading the map in batches. A batch walk goes bucket by bucket:
// entries the datapath adds or evicts meanwhile (an LRU map under
// traffic) are seen or not, where a key-by-key walk whose current key is
// evicted starts over, and gives up after max_entries steps.
func eachEntry[K, V any](m *ebpf.Map, fn func(K, V) bool) error {
	keys, values := make([]K, flowBatch), make([]V, flowBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		for i := range n {
			if !fn(keys[i], values[i]) {
				return nil
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Flow looks up one tracked flow, as the datapath does: confirmed, else
// unconfirmed.
func (d *Dataplane) Flow(k FlowKey) (Flow, bool, error) {
	_, f, ok, err := d.lookupFlow(k)
	return f, ok, err
}

// lookupFlow finds a flow and the table that holds it.
func (d *Dataplane) lookupFlow(k FlowKey) (flowTable, Flow, bool, error) {
	raw := k.raw()
	for _, t := range d.flowTables() {
		var v xdp.CtEntry
		err := t.m.Lookup(raw, &v)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return t, Flow{}, false, fmt.Errorf("%s lookup: %w", t.name, err)
		}
		return t, flowOf(raw, v), true, nil
	}
	return flowTable{}, Flow{}, false, nil
}

// DeleteFlow ends a flow whose backend is gone or left its port (see
// reconcile.PurgeFlows): its conntrack entry goes, and its reverse half
// when the nat map holds it for this flow.
//
// A reverse half in a SNAT slot stays: writing the slot from here could
// undo a claim a CPU makes under the slot's lock meanwhile (another
// backend's flow for the same slot). The bucket's hand takes the port back
// once the flow is over, and a late reply that finds the slot is dropped,
// forgetting it, unless it can rebuild the flow: the datapath rebuilds a
// missing forward half from its reverse half when the backend still
// exists, as it does when one is evicted. So for a backend that still
// exists (it left this port but serves another) the entry is not deleted
// but ended: marked, for the agent, and dated so far back (endedAge) that
// the datapath takes it as expired under any timeout. Rewriting an entry
// of an LRU map takes a fresh node (on a full map, another entry's), so
// only those flows are ended that way.
//
// f is as a walk of the flows read it. When its tuple carries another
// flow by now (the datapath re-chose for the client after its backend
// went, while a long walk went on), that flow is live and is left alone,
// with whatever reverse half it has, and DeleteFlow reports false. The
// check and the delete are two system calls: a flow re-created between
// them (microseconds, where a walk takes up to seconds) is deleted, and
// the datapath starts it afresh on its next packet.
func (d *Dataplane) DeleteFlow(f Flow) (bool, error) {
	raw := f.Key().raw()
	var errs []error
	table, found, ok, err := d.lookupFlow(f.Key())
	switch {
	case err != nil:
		return false, fmt.Errorf("delete flow %s -> %s: %w", f.Client, f.Frontend, err)
	case !ok:
		// Gone already; its reverse half may linger in the nat map.
	case !sameFlow(f, found):
		return false, nil
	default:
		var cur xdp.CtEntry
		if err := table.m.Lookup(raw, &cur); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, fmt.Errorf("delete flow %s -> %s: read %s: %w", f.Client, f.Frontend, table.name, err)
		}
		end, err := d.endInPlace(f)
		if err != nil {
			return false, fmt.Errorf("delete flow %s -> %s: %w", f.Client, f.Frontend, err)
		}
		if end {
			cur.Flags |= uint8(xdp.CtFlagsCT_F_ENDED)
			cur.LastSeenNs = uint64(Now()) - endedAge
			err = table.m.Update(raw, cur, ebpf.UpdateExist)
		} else {
			err = table.m.Delete(raw)
		}
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("end conntrack entry: %w", err))
		}
	}
	rk := reverseKey(f)
	for _, table := range d.natTables() {
		var rev xdp.NatEntry
		switch err := table.m.Lookup(rk, &rev); {
		case errors.Is(err, ebpf.ErrKeyNotExist):
		case err != nil:
			errs = append(errs, fmt.Errorf("read reverse NAT entry from %s: %w", table.name, err))
		case reverseOf(rev, f):
			if err := table.m.Delete(rk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("delete reverse NAT entry from %s: %w", table.name, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return false, fmt.Errorf("delete flow %s -> %s: %w", f.Client, f.Frontend, err)
	}
	return true, nil
}

// natTables are the maps that hold reverse halves by their reply tuple:
// nat, and nat_unconfirmed where the pins have it. (A SNAT flow's reverse
// half is mostly in its port's slot instead.)
func (d *Dataplane) natTables() []flowTable {
	tables := []flowTable{{"nat", d.m.NAT}}
	if d.m.NATUnconfirmed != nil {
		tables = append(tables, flowTable{"nat_unconfirmed", d.m.NATUnconfirmed})
	}
	return tables
}

// reverseOf tells whether a reverse half is f's.
func reverseOf(rev xdp.NatEntry, f Flow) bool {
	return rev.ClientAddr == xdp.AddrToNet(f.Client.Addr()) && rev.ClientPort == xdp.PortToNet(f.Client.Port()) &&
		rev.FrontendAddr == xdp.AddrToNet(f.Frontend.Addr()) && rev.FrontendPort == xdp.PortToNet(f.Frontend.Port())
}

// endedAge is how far back an ended conntrack entry is dated: about 146
// years, beyond any timeout. The datapath computes idle times as now -
// last_seen in unsigned 64-bit arithmetic, so the date wraps below zero
// and the idle time still comes out as this.
const endedAge = uint64(1) << 62

// endInPlace tells whether f's entry must be ended rather than deleted: its
// backend still exists and its reverse half is in a SNAT slot, which
// stays, so a late reply could rebuild a deleted entry from the slot. The
// backend is checked first: a purge of removed backends, the large one,
// then reads nothing more.
func (d *Dataplane) endInPlace(f Flow) (bool, error) {
	if !f.NAT.IsValid() {
		return false, nil // no SNAT slot
	}
	var b xdp.Backend
	switch err := d.m.Backends.Lookup(f.BackendID, &b); {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read backend %d: %w", f.BackendID, err)
	}
	if b.Addr != xdp.AddrToNet(f.Backend.Addr()) || b.Port != xdp.PortToNet(f.Backend.Port()) {
		return false, nil
	}
	_, _, inSlot, err := d.reverseSlot(f)
	return inSlot, err
}

// sameFlow tells whether two readings of a tuple's conntrack entry are one
// flow: the same backend, chosen at the same time.
func sameFlow(a, b Flow) bool {
	return a.BackendID == b.BackendID && a.Backend == b.Backend && a.Created == b.Created
}

// reverseKey is the reply tuple of a flow, as its backend sends it.
func reverseKey(f Flow) xdp.NatKey {
	rk := xdp.NatKey{
		Saddr: xdp.AddrToNet(f.Backend.Addr()), Sport: xdp.PortToNet(f.Backend.Port()),
		Daddr: xdp.AddrToNet(f.Client.Addr()), Dport: xdp.PortToNet(f.Client.Port()),
		Proto: f.Proto,
	}
	if f.NAT.IsValid() {
		rk.Daddr = xdp.AddrToNet(f.NAT.Addr())
		rk.Dport = xdp.PortToNet(f.NAT.Port())
	}
	return rk
}

// snatSlot is the index of a SNAT flow's slot (see struct snat_slot), and
// false when the flow has no SNAT port in the configured range.
func (d *Dataplane) snatSlot(f Flow) (uint32, bool, error) {
	if !f.NAT.IsValid() {
		return 0, false, nil
	}
	var cfg xdp.DatapathConfig
	if err := d.m.Config.Lookup(uint32(0), &cfg); err != nil {
		return 0, false, fmt.Errorf("read datapath config: %w", err)
	}
	port, ports := f.NAT.Port(), xdp.SNATPortsOf(&cfg)
	if !ports.Contains(port) {
		return 0, false, nil
	}
	var hint uint32
	if err := d.m.SNATBucketHints.Lookup(xdp.SNATHint(f.Backend, f.NAT.Addr(), f.Proto), &hint); err != nil {
		return 0, false, fmt.Errorf("read SNAT bucket hint: %w", err)
	}
	bucket, ok := xdp.SNATHintBucket(hint, cfg.SnatBuckets)
	if !ok {
		return 0, false, nil // no slot holds a reply tuple of this backend
	}
	return xdp.SNATSlot(bucket, port, ports), true, nil
}

// reverseSlot reads the SNAT slot that is f's reverse half; ok is false
// when the slot answers to another flow or to none.
func (d *Dataplane) reverseSlot(f Flow) (index uint32, slot xdp.SnatSlot, ok bool, err error) {
	index, isSNAT, err := d.snatSlot(f)
	if err != nil || !isSNAT {
		return 0, slot, false, err
	}
	if err := d.m.SNATSlots.Lookup(index, &slot); err != nil {
		return 0, slot, false, fmt.Errorf("read SNAT slot %d: %w", index, err)
	}
	rk := reverseKey(f)
	ok = slot.Key.Proto != 0 && slot.Key == rk && reverseOf(slot.Rev, f)
	return index, slot, ok, nil
}

// DeleteReverse forgets the reverse half of a flow: its SNAT slot, or its
// entry in the NAT map for a flow without SNAT. Tests use it to lose a
// reverse half as an eviction would; it writes a slot without its lock,
// so it is not for a datapath that is serving traffic.
func (d *Dataplane) DeleteReverse(f Flow) error {
	index, slot, ok, err := d.reverseSlot(f)
	if err != nil {
		return err
	}
	if ok {
		slot.Key.Proto = 0
		slot.Generation++
		if err := d.m.SNATSlots.Put(index, slot); err != nil {
			return fmt.Errorf("free SNAT slot %d: %w", index, err)
		}
		return nil
	}
	for _, table := range d.natTables() {
		if err := table.m.Delete(reverseKey(f)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete reverse NAT entry from %s: %w", table.name, err)
		}
	}
	return nil
}

// UpdateReverse lets fn change the reverse half of a flow in place (tests
// use it to age an entry). It reports whether the flow had one.
func (d *Dataplane) UpdateReverse(f Flow, fn func(*xdp.NatEntry)) (bool, error) {
	index, slot, ok, err := d.reverseSlot(f)
	if err != nil {
		return false, err
	}
	if ok {
		fn(&slot.Rev)
		if err := d.m.SNATSlots.Put(index, slot); err != nil {
			return false, fmt.Errorf("write SNAT slot %d: %w", index, err)
		}
		return true, nil
	}
	rk := reverseKey(f)
	for _, table := range d.natTables() {
		var e xdp.NatEntry
		if err := table.m.Lookup(rk, &e); errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		} else if err != nil {
			return false, fmt.Errorf("read reverse NAT entry from %s: %w", table.name, err)
		}
		fn(&e)
		if err := table.m.Put(rk, e); err != nil {
			return false, fmt.Errorf("write reverse NAT entry to %s: %w", table.name, err)
		}
		return true, nil
	}
	return false, nil
}

// ReverseHalves calls fn with the reply tuple and entry of every reverse
// half (NAT map entries, confirmed then unconfirmed, then claimed SNAT
// slots; a slot whose flow ended counts until a new flow takes it) until
// fn returns false.
func (d *Dataplane) ReverseHalves(fn func(xdp.NatKey, xdp.NatEntry) bool) error {
	for _, table := range d.natTables() {
		var k xdp.NatKey
		var v xdp.NatEntry
		it := table.m.Iterate()
		for it.Next(&k, &v) {
			if !fn(k, v) {
				return nil
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read %s: %w", table.name, err)
		}
	}
	return eachClaimedSlot(d.m.SNATSlots, func(s xdp.SnatSlot) bool { return fn(s.Key, s.Rev) })
}

// ReverseEntries counts the reverse halves (see ReverseHalves).
func (d *Dataplane) ReverseEntries() (int, error) {
	n := 0
	err := d.ReverseHalves(func(xdp.NatKey, xdp.NatEntry) bool { n++; return true })
	return n, err
}

// FlowEntries counts the forward halves, confirmed and unconfirmed.
func (d *Dataplane) FlowEntries() (int, error) {
	total := 0
	for _, t := range d.flowTables() {
		n, err := countEntries[xdp.CtKey, xdp.CtEntry](t.m)
		if err != nil {
			return total, fmt.Errorf("count %s: %w", t.name, err)
		}
		total += n
	}
	return total, nil
}

// ResetFlows forgets every tracked flow: conntrack, both kinds of reverse
// halves, SNAT port hands, ClientIP affinity, the SYN proxy's offsets and
// handshake counts. Flows in progress start
// over as new ones. It is for a datapath without traffic (perf runs use it
// between repetitions).
func (d *Dataplane) ResetFlows() error {
	steps := []struct {
		what  string
		clear func() error
	}{
		{"conntrack", func() error {
			for _, t := range d.flowTables() {
				if err := clearHash[xdp.CtKey, xdp.CtEntry](t.m); err != nil {
					return fmt.Errorf("%s: %w", t.name, err)
				}
			}
			return nil
		}},
		// Slots before the NAT map: zeroing drops the slots' spill marks,
		// and a spill made before that must go too.
		{"SNAT slots", func() error { return zeroArray[xdp.SnatSlot](d.m.SNATSlots) }},
		{"NAT maps", func() error {
			for _, t := range d.natTables() {
				if err := clearHash[xdp.NatKey, xdp.NatEntry](t.m); err != nil {
					return fmt.Errorf("%s: %w", t.name, err)
				}
			}
			return nil
		}},
		{"affinity", func() error { return clearHash[xdp.AffinityKey, xdp.AffinityEntry](d.m.Affinity) }},
		{"SYN proxy", func() error {
			if d.m.SYNProxyFlows == nil {
				return nil
			}
			if err := clearHash[xdp.CtKey, xdp.SynproxySeq](d.m.SYNProxyFlows); err != nil {
				return err
			}
			return zeroArray[xdp.SynFlood](d.m.SYNFloods)
		}},
		{"SNAT bucket hands", func() error { return zeroArray[xdp.SnatBucketHand](d.m.SNATBucketHands) }},
		{"SNAT backend hands", func() error { return zeroArray[uint32](d.m.SNATBackendHands) }},
	}
	for _, step := range steps {
		if err := step.clear(); err != nil {
			return fmt.Errorf("clear %s: %w", step.what, err)
		}
	}
	return nil
}

const flowBatch = 4096

// eachClaimedSlot calls fn for every claimed SNAT slot until it returns
// false, reading the array in batches.
func eachClaimedSlot(m *ebpf.Map, fn func(xdp.SnatSlot) bool) error {
	keys := make([]uint32, flowBatch)
	slots := make([]xdp.SnatSlot, flowBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, slots, nil)
		for _, s := range slots[:n] {
			if s.Key.Proto != 0 && !fn(s) {
				return nil
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read SNAT slots: %w", err)
		}
	}
}

// claimedSlots counts the SNAT slots in use.
func claimedSlots(m *ebpf.Map) (int, error) {
	n := 0
	err := eachClaimedSlot(m, func(xdp.SnatSlot) bool { n++; return true })
	return n, err
}

// clearHash deletes every entry of a hash map, in batches.
func clearHash[K, V any](m *ebpf.Map) error {
	keys, values := make([]K, flowBatch), make([]V, flowBatch)
	for {
		var cursor ebpf.MapBatchCursor
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
		if n == 0 {
			return nil
		}
		if _, err := m.BatchDelete(keys[:n], nil); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
}

// zeroArray writes zero values over a whole array map, in batches.
func zeroArray[V any](m *ebpf.Map) error {
	values := make([]V, flowBatch)
	keys := make([]uint32, flowBatch)
	for start := uint32(0); start < m.MaxEntries(); start += flowBatch {
		n := min(flowBatch, m.MaxEntries()-start)
		for i := range keys[:n] {
			keys[i] = start + uint32(i)
		}
		if _, err := m.BatchUpdate(keys[:n], values[:n], nil); err != nil {
			return err
		}
	}
	return nil
}

// Now returns the datapath's clock (CLOCK_MONOTONIC, as bpf_ktime_get_ns).
func Now() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// tcpClosing are the state bits of a TCP connection that is closing: a
// FIN either way, or a RST (CT_TCP_CLOSING in include/conntrack.h).
const tcpClosing = uint8(xdp.CtTcpStateCT_TCP_FIN | xdp.CtTcpStateCT_TCP_REPLY_FIN |
	xdp.CtTcpStateCT_TCP_RST)

// TCPClosing reports whether a flow's TCP state bits say it is closing.
func TCPClosing(state uint8) bool { return state&tcpClosing != 0 }

// TCPClosed reports whether a flow's TCP state bits say the connection is
// over: reset, or a FIN seen each way (ct_tcp_closed). A SYN on its tuple
// starts a new flow.
func TCPClosed(state uint8) bool {
	fins := uint8(xdp.CtTcpStateCT_TCP_FIN | xdp.CtTcpStateCT_TCP_REPLY_FIN)
	return state&uint8(xdp.CtTcpStateCT_TCP_RST) != 0 || state&fins == fins
}

// TCPEstablished reports whether a flow's TCP state bits say it is past
// its handshake and not closing (ct_tcp_established).
func TCPEstablished(state uint8) bool {
	return state&uint8(xdp.CtTcpStateCT_TCP_ESTABLISHED) != 0 && !TCPClosing(state)
}
