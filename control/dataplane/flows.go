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
	Created   time.Duration // CLOCK_MONOTONIC timestamps, as the kernel keeps them
	LastSeen  time.Duration
}

// FlowKey identifies a flow by its client-side tuple.
type FlowKey struct {
	Client   netip.AddrPort
	Frontend netip.AddrPort
	Proto    uint8
}

func (k FlowKey) raw() xdp.NicCtKey {
	return xdp.NicCtKey{
		Saddr: xdp.AddrToNet(k.Client.Addr()), Sport: xdp.PortToNet(k.Client.Port()),
		Daddr: xdp.AddrToNet(k.Frontend.Addr()), Dport: xdp.PortToNet(k.Frontend.Port()),
		Proto: k.Proto,
	}
}

func flowOf(k xdp.NicCtKey, v xdp.NicCtEntry) Flow {
	f := Flow{
		Client:    netip.AddrPortFrom(xdp.NetToAddr(k.Saddr), xdp.NetToPort(k.Sport)),
		Frontend:  netip.AddrPortFrom(xdp.NetToAddr(k.Daddr), xdp.NetToPort(k.Dport)),
		Proto:     k.Proto,
		BackendID: v.BackendId,
		Backend:   netip.AddrPortFrom(xdp.NetToAddr(v.BackendAddr), xdp.NetToPort(v.BackendPort)),
		SvcID:     v.SvcId,
		TCPState:  v.TcpState,
		External:  v.Flags&uint8(xdp.NicCtFlagsCT_F_EXTERNAL) != 0,
		Created:   time.Duration(v.CreatedNs),
		LastSeen:  time.Duration(v.LastSeenNs),
	}
	if v.Flags&uint8(xdp.NicCtFlagsCT_F_SNAT) != 0 {
		f.NAT = netip.AddrPortFrom(xdp.NetToAddr(v.NatAddr), xdp.NetToPort(v.NatPort))
	}
	return f
}

// Key returns the flow's key.
func (f Flow) Key() FlowKey { return FlowKey{Client: f.Client, Frontend: f.Frontend, Proto: f.Proto} }

// Flows calls fn for every tracked flow until fn returns false.
func (d *Dataplane) Flows(fn func(Flow) bool) error {
	var k xdp.NicCtKey
	var v xdp.NicCtEntry
	it := d.m.Conntrack.Iterate()
	for it.Next(&k, &v) {
		if !fn(flowOf(k, v)) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read conntrack: %w", err)
	}
	return nil
}

// Flow looks up one tracked flow.
func (d *Dataplane) Flow(k FlowKey) (Flow, bool, error) {
	var v xdp.NicCtEntry
	raw := k.raw()
	err := d.m.Conntrack.Lookup(raw, &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return Flow{}, false, nil
	}
	if err != nil {
		return Flow{}, false, fmt.Errorf("conntrack lookup: %w", err)
	}
	return flowOf(raw, v), true, nil
}

// DeleteFlow forgets a flow, both halves.
func (d *Dataplane) DeleteFlow(f Flow) error {
	var errs []error
	if err := d.m.Conntrack.Delete(f.Key().raw()); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, err)
	}
	rk := xdp.NicNatKey{
		Saddr: xdp.AddrToNet(f.Backend.Addr()), Sport: xdp.PortToNet(f.Backend.Port()),
		Daddr: xdp.AddrToNet(f.Client.Addr()), Dport: xdp.PortToNet(f.Client.Port()),
		Proto: f.Proto,
	}
	if f.NAT.IsValid() {
		rk.Daddr = xdp.AddrToNet(f.NAT.Addr())
		rk.Dport = xdp.PortToNet(f.NAT.Port())
	}
	if err := d.m.NAT.Delete(rk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete flow %s -> %s: %w", f.Client, f.Frontend, err)
	}
	return nil
}

// ReverseEntries counts the reverse NAT entries.
func (d *Dataplane) ReverseEntries() (int, error) {
	n := 0
	var k xdp.NicNatKey
	var v xdp.NicNatEntry
	it := d.m.NAT.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n, it.Err()
}

// Now returns the datapath's clock (CLOCK_MONOTONIC, as bpf_ktime_get_ns).
func Now() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
