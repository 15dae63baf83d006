package loader

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/xdp"
)

// DefaultPinRoot is where bpffs is mounted on a normal host.
const DefaultPinRoot = "/sys/fs/bpf"

// Options size the maps and configure the datapath. The zero value is not
// useful; start from DefaultOptions.
type Options struct {
	// PinRoot is a directory on bpffs (mounted there if it is not one yet).
	PinRoot string

	ConntrackMax uint32 // tracked flows, confirmed
	// UnconfirmedMax is how many flows may wait for confirmation (see
	// ct_unconfirmed in xdp/include/maps.h); 0: UnconfirmedFlows's default.
	UnconfirmedMax  uint32
	NATMax          uint32 // reverse NAT entries: one per tracked flow (see SNATSlots)
	AffinityMax     uint32 // ClientIP affinity entries
	ServicesMax     uint32 // service ports (ids, counters, Maglev tables)
	FrontendsMax    uint32 // address/port/protocol frontends
	BackendsMax     uint32 // backend ids
	SourceRangesMax uint32 // loadBalancerSourceRanges entries

	TCPEstablishedTimeout time.Duration
	TCPTransientTimeout   time.Duration
	UDPTimeout            time.Duration
	HashSeed              uint32
	// SNATPorts are the source ports of SNAT flows, per backend address
	// and port and node address (see docs/snat.md).
	SNATPorts xdp.SNATPorts
	// SNATSocketCheckBelow: a SNAT flow takes a port below this only if
	// the host has no socket a reply would reach (see docs/snat.md); the
	// agent sets the start of the host's ip_local_port_range.
	SNATSocketCheckBelow uint16
	// SNATExtraAddrs are more SNAT source addresses (invalid ones unused):
	// an attached interface that has some of them besides its first
	// address spreads its SNAT flows over them all, each address with
	// SNATPorts of its own.
	SNATExtraAddrs [MaxSNATExtraAddrs]netip.Addr
	// HairpinAddr is the source address of hairpin flows (a pod reaching
	// itself through a service); link-local, never on the wire.
	HairpinAddr netip.Addr
	// ICMPRate limits the ICMP port unreachables the datapath builds to
	// this many a second per CPU, after a burst of ICMPErrorBurst, as the kernel
	// limits its own errors (fragmentation needed is never limited);
	// 0: no limit.
	ICMPRate uint32
	// SYNCookies is when the XDP program answers SYNs to external
	// frontends with SYN cookies and proxies the handshakes that
	// answer them (see xdp/include/synproxy.h).
	SYNCookies SYNCookieMode
	// SYNFloodThreshold is, with SYNCookiesAuto, how many handshakes a
	// service port may leave incomplete within a second before its SYNs
	// are answered with cookies.
	SYNFloodThreshold uint32

	// faults stand in for system calls tests make fail; nil makes the
	// real ones (a pointer keeps Options comparable).
	faults *faults
}

// faults are the system calls a load makes that tests can make fail.
type faults struct {
	liftMemlock func() error                // rlimit.RemoveMemlock
	renamePin   func(from, to string) error // os.Rename, moving pinned maps into place
	noTCX       bool                        // link.AttachTCX fails as on a kernel without tcx
	delFilter   func(netlink.Filter) error  // netlink.FilterDel, as Revert removes a clsact filter
}

func (f *faults) removeMemlock() error {
	if f != nil && f.liftMemlock != nil {
		return f.liftMemlock()
	}
	return rlimit.RemoveMemlock()
}

func (f *faults) attachTCX(opts link.TCXOptions) (link.Link, error) {
	if f != nil && f.noTCX {
		return nil, fmt.Errorf("attach tcx: %w", ebpf.ErrNotSupported)
	}
	return link.AttachTCX(opts)
}

func (f *faults) filterDel(filter netlink.Filter) error {
	if f != nil && f.delFilter != nil {
		return f.delFilter(filter)
	}
	return netlink.FilterDel(filter)
}

func (f *faults) rename(from, to string) error {
	if f != nil && f.renamePin != nil {
		return f.renamePin(from, to)
	}
	return os.Rename(from, to)
}

// SYNCookieMode says when SYNs are answered with SYN cookies.
type SYNCookieMode uint32

// The SYN cookie modes: enum syn_cookie_mode in xdp/include/structs.h.
const (
	SYNCookiesOff    = SYNCookieMode(xdp.SynCookieModeSYN_COOKIES_OFF)
	SYNCookiesAuto   = SYNCookieMode(xdp.SynCookieModeSYN_COOKIES_AUTO)
	SYNCookiesAlways = SYNCookieMode(xdp.SynCookieModeSYN_COOKIES_ALWAYS)
)

var synCookieModeNames = map[SYNCookieMode]string{
	SYNCookiesOff: "off", SYNCookiesAuto: "auto", SYNCookiesAlways: "always",
}

func (m SYNCookieMode) String() string {
	if name, ok := synCookieModeNames[m]; ok {
		return name
	}
	return fmt.Sprintf("SYNCookieMode(%d)", uint32(m))
}

// ParseSYNCookieMode reads a mode by its name: off, auto or always.
func ParseSYNCookieMode(name string) (SYNCookieMode, error) {
	for m, n := range synCookieModeNames {
		if n == name {
			return m, nil
		}
	}
	return 0, fmt.Errorf("SYN cookie mode %q is not one of off, auto, always", name)
}

// MaxICMPRate is the highest ICMPRate: one error a nanosecond.
const MaxICMPRate = uint32(time.Second)

// ICMPErrorBurst is how many ICMP port unreachables a CPU may send at once
// before ICMPRate applies: ICMP_ERROR_BURST in xdp/include/icmp_limit.h.
const ICMPErrorBurst = 50

// DefaultSNATPorts are every port from 1024 up but the default NodePort
// range (30000-32767) and the part of Linux's default ephemeral range
// (ip_local_port_range 32768-60999) left to the host's own connections,
// 32768-39999: 54,512 ports. Ports 40000-60999 are reserved from the host
// (ip_local_reserved_ports); the rest it can only take by binding them
// explicitly, and a claim passes over a port the host has a socket on.
// docs/snat.md says why.
var DefaultSNATPorts = xdp.SNATPorts{{Min: 1024, Max: 29999}, {Min: 40000, Max: 65535}}

// MaxSNATExtraAddrs is how many extra SNAT addresses there may be
// (IFACE_EXTRA_ADDRS in xdp/include/structs.h).
const MaxSNATExtraAddrs = len(xdp.Iface{}.ExtraAddrs)

// DefaultSNATPortsBeside is DefaultSNATPorts less the ports of a NodePort
// range other than the default one: the two largest pieces left.
func DefaultSNATPortsBeside(nodePorts xdp.PortRange) xdp.SNATPorts {
	var pieces []xdp.PortRange
	for _, r := range DefaultSNATPorts.Ranges() {
		if nodePorts.Len() == 0 || nodePorts.Max < r.Min || nodePorts.Min > r.Max {
			pieces = append(pieces, r)
			continue
		}
		if nodePorts.Min > r.Min {
			pieces = append(pieces, xdp.PortRange{Min: r.Min, Max: nodePorts.Min - 1})
		}
		if nodePorts.Max < r.Max {
			pieces = append(pieces, xdp.PortRange{Min: nodePorts.Max + 1, Max: r.Max})
		}
	}
	// The two largest, kept in port order.
	for len(pieces) > 2 {
		smallest := 0
		for i, p := range pieces {
			if p.Len() < pieces[smallest].Len() {
				smallest = i
			}
		}
		pieces = append(pieces[:smallest], pieces[smallest+1:]...)
	}
	var ports xdp.SNATPorts
	copy(ports[:], pieces)
	return ports
}

// DefaultOptions are sized for a large edge node: half a million tracked
// flows and 64k service ports fit in well under 1 GiB of map memory.
func DefaultOptions() Options {
	return Options{
		PinRoot:               DefaultPinRoot,
		ConntrackMax:          524288,
		NATMax:                524288,
		AffinityMax:           65536,
		ServicesMax:           65536,
		FrontendsMax:          262144,
		BackendsMax:           262144,
		SourceRangesMax:       65536,
		TCPEstablishedTimeout: 6 * time.Hour,
		TCPTransientTimeout:   60 * time.Second,
		UDPTimeout:            60 * time.Second,
		HashSeed:              0x5eed1b,
		SNATPorts:             DefaultSNATPorts,
		SNATSocketCheckBelow:  32768, // Linux's default ip_local_port_range starts there
		HairpinAddr:           netip.MustParseAddr("169.254.42.1"),
		ICMPRate:              1000,
		SYNCookies:            SYNCookiesAuto,
		SYNFloodThreshold:     1000,
	}
}

// SNATBuckets is how many copies of the SNAT port range hold the reverse
// halves of SNAT flows (each backend gets one in turn): enough for twice
// NATMax flows, so that a port comes back to be offered long after its
// flow was likely evicted. Flows without SNAT keep their reverse halves in
// the NAT map, sized NATMax.
func (o Options) SNATBuckets() uint32 {
	r := uint64(o.snatRange())
	return uint32(max(1, (2*uint64(o.NATMax)+r-1)/r))
}

// UnconfirmedFlows is the size of the table of flows not confirmed yet:
// UnconfirmedMax, or by default a quarter of ConntrackMax (at least 1024).
// New flows, spoofed or not, only ever displace each other there.
func (o Options) UnconfirmedFlows() uint32 {
	if o.UnconfirmedMax != 0 {
		return o.UnconfirmedMax
	}
	return max(o.ConntrackMax/4, 1024)
}

// SNATSlots is the size of the SNAT slot array.
func (o Options) SNATSlots() uint32 {
	return uint32(min(uint64(o.SNATBuckets())*uint64(o.snatRange()), math.MaxUint32))
}

func (o Options) snatRange() uint32 {
	return max(1, o.SNATPorts.Len())
}

// Validate reports the first option that cannot work.
func (o Options) Validate() error {
	var errs []error
	positive := map[string]uint32{
		"conntrack max":     o.ConntrackMax,
		"NAT max":           o.NATMax,
		"affinity max":      o.AffinityMax,
		"services max":      o.ServicesMax,
		"frontends max":     o.FrontendsMax,
		"backends max":      o.BackendsMax,
		"source ranges max": o.SourceRangesMax,
	}
	for _, name := range []string{"conntrack max", "NAT max", "affinity max", "services max",
		"frontends max", "backends max", "source ranges max"} {
		if positive[name] == 0 {
			errs = append(errs, fmt.Errorf("%s must be at least 1", name))
		}
	}
	for name, d := range map[string]time.Duration{
		"TCP established timeout": o.TCPEstablishedTimeout,
		"TCP transient timeout":   o.TCPTransientTimeout,
		"UDP timeout":             o.UDPTimeout,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", name, d))
		}
	}
	if o.SNATPorts[0].Len() == 0 || o.SNATPorts[0].Min == 0 {
		errs = append(errs, fmt.Errorf("SNAT port range %s is empty", o.SNATPorts[0]))
	}
	if second := o.SNATPorts[1]; second.Max != 0 && (second.Len() == 0 || second.Min <= o.SNATPorts[0].Max) {
		errs = append(errs, fmt.Errorf("second SNAT port range %s is empty, or not above the first, %s", second, o.SNATPorts[0]))
	}
	if _, ok := synCookieModeNames[o.SYNCookies]; !ok {
		errs = append(errs, fmt.Errorf("SYN cookie mode %d is unknown", uint32(o.SYNCookies)))
	}
	if o.SYNCookies == SYNCookiesAuto && o.SYNFloodThreshold == 0 {
		errs = append(errs, errors.New("SYN flood threshold must be at least 1 (SYN cookies always: mode always)"))
	}
	if o.ICMPRate > MaxICMPRate {
		errs = append(errs, fmt.Errorf("ICMP rate %d is above %d a second", o.ICMPRate, MaxICMPRate))
	}
	if !o.HairpinAddr.Is4() {
		errs = append(errs, fmt.Errorf("hairpin address %s is not IPv4", o.HairpinAddr))
	}
	if o.PinRoot == "" {
		errs = append(errs, errors.New("pin root must be set"))
	}
	return errors.Join(errs...)
}
