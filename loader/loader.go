package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

// SchemaVersion names the pin directory. Bump it whenever the layout of a
// key or value in xdp/include/structs.h changes.
const SchemaVersion = "v1"

// Maps are the datapath's pinned maps (see xdp/include/maps.h).
type Maps struct {
	Config           *ebpf.Map
	Ifaces           *ebpf.Map
	TxPorts          *ebpf.Map
	FrontendPorts    *ebpf.Map
	HostBackendPorts *ebpf.Map
	Frontends        *ebpf.Map
	Backends         *ebpf.Map
	MaglevTables     *ebpf.Map
	SourceRanges     *ebpf.Map
	Conntrack        *ebpf.Map // confirmed flows
	CtUnconfirmed    *ebpf.Map // flows not confirmed yet; nil in pins of an earlier version
	NAT              *ebpf.Map
	NATUnconfirmed   *ebpf.Map // reverse halves of unconfirmed flows without SNAT; nil in pins of an earlier version
	SNATSlots        *ebpf.Map
	SNATBucketHints  *ebpf.Map
	SNATBucketHands  *ebpf.Map
	SNATBackendHands *ebpf.Map
	Affinity         *ebpf.Map
	Stats            *ebpf.Map
	SvcStats         *ebpf.Map
	SvcNames         *ebpf.Map
	AgentState       *ebpf.Map
	RouteReuse       *ebpf.Map
	SYNProxyFlows    *ebpf.Map // sequence offsets of flows the SYN proxy opened; nil in pins of an earlier version
	SYNFloods        *ebpf.Map // handshake counts by service port; nil in pins of an earlier version
}

// newFlowRoutes is the pinned map of routes new flows reuse (a cache).
const newFlowRoutes = "new_flow_routes"

// optionalMaps are maps OpenPinned may find missing: a datapath pinned by
// an earlier version, before they existed, is still inspected.
var optionalMaps = map[string]bool{"route_reuse": true, "ct_unconfirmed": true,
	"synproxy_flows": true, "syn_floods": true, "nat_unconfirmed": true}

// byName maps the C names of the maps to their handles.
func (m *Maps) byName() map[string]**ebpf.Map {
	return map[string]**ebpf.Map{
		"config":             &m.Config,
		"route_reuse":        &m.RouteReuse,
		"ifaces":             &m.Ifaces,
		"tx_ports":           &m.TxPorts,
		"frontend_ports":     &m.FrontendPorts,
		"host_backend_ports": &m.HostBackendPorts,
		"frontends":          &m.Frontends,
		"backends":           &m.Backends,
		"maglev_tables":      &m.MaglevTables,
		"source_ranges":      &m.SourceRanges,
		"conntrack":          &m.Conntrack,
		"ct_unconfirmed":     &m.CtUnconfirmed,
		"nat":                &m.NAT,
		"nat_unconfirmed":    &m.NATUnconfirmed,
		"snat_slots":         &m.SNATSlots,
		"snat_bucket_hints":  &m.SNATBucketHints,
		"snat_bucket_hands":  &m.SNATBucketHands,
		"snat_backend_hands": &m.SNATBackendHands,
		"affinity":           &m.Affinity,
		"stats":              &m.Stats,
		"svc_stats":          &m.SvcStats,
		"svc_names":          &m.SvcNames,
		"agent":              &m.AgentState,
		"synproxy_flows":     &m.SYNProxyFlows,
		"syn_floods":         &m.SYNFloods,
	}
}

// All returns every map by its C name.
func (m *Maps) All() map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	for name, h := range m.byName() {
		out[name] = *h
	}
	return out
}

// Close releases the file descriptors; pinned maps stay.
func (m *Maps) Close() error {
	var errs []error
	for _, mp := range m.byName() {
		if *mp != nil {
			errs = append(errs, (*mp).Close())
			*mp = nil
		}
	}
	return errors.Join(errs...)
}

// Datapath is the loaded datapath: its maps and programs, not yet attached.
type Datapath struct {
	Maps Maps

	nic        *ebpf.Program    // XDP on the NIC
	nicIngress *ebpf.Program    // TC ingress on the NIC
	pod        *ebpf.Program    // TC ingress on pod interfaces
	hostReply  *ebpf.Program    // TC egress on the NIC and pod interfaces
	sock       *ebpf.Collection // cgroup socket programs for host processes
	dir        string
	opts       Options
	log        *slog.Logger

	// Until CommitPins: the maps that replace pinned ones, what the
	// attaches changed (see Revert) and the configuration the load
	// overwrote.
	replacements  *mapReplacements
	committed     bool
	revertSteps   []revertStep
	earlierConfig xdp.DatapathConfig
}

// Load creates the maps, or adopts those pinned by an earlier agent without
// touching their contents, loads the programs and writes the datapath
// configuration. Maps whose size changed are migrated: a new map is created
// and every entry that fits is copied over. The new maps replace the pinned
// ones, all of them or none, at CommitPins: until then the pins name the
// maps an earlier datapath still attached uses, and Revert puts back what
// the attaches changed.
func Load(opts Options, log *slog.Logger) (*Datapath, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("invalid datapath options: %w", err)
	}
	// Where the kernel charges BPF maps to RLIMIT_MEMLOCK (before 5.11;
	// a no-op where it charges them to the memory cgroup), the default
	// limit is far below the datapath's maps, and map creation over it
	// fails with EPERM.
	if err := opts.faults.removeMemlock(); err != nil {
		return nil, explainMemlockError(err)
	}
	if err := ensureBPFFS(opts.PinRoot, log); err != nil {
		return nil, err
	}
	for _, dir := range []string{mapsDir(opts.PinRoot), linksDir(opts.PinRoot)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create pin directory: %w", err)
		}
	}

	// new_flow_routes caches routes at most a second old: it starts empty
	// at every load, whatever an earlier version pinned there.
	if err := os.Remove(filepath.Join(mapsDir(opts.PinRoot), newFlowRoutes)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("unpin the new-flow route cache: %w", err)
	}

	nicSpec, err := xdp.LoadNic()
	if err != nil {
		return nil, fmt.Errorf("read embedded XDP object: %w", err)
	}
	ingressSpec, err := xdp.LoadNicIngress()
	if err != nil {
		return nil, fmt.Errorf("read embedded TC object: %w", err)
	}
	podSpec, err := xdp.LoadPod()
	if err != nil {
		return nil, fmt.Errorf("read embedded pod TC object: %w", err)
	}
	hostReplySpec, err := xdp.LoadHostReply()
	if err != nil {
		return nil, fmt.Errorf("read embedded host reply TC object: %w", err)
	}
	sockSpec, err := xdp.LoadSock()
	if err != nil {
		return nil, fmt.Errorf("read embedded socket object: %w", err)
	}
	if err := sizeMaps(nicSpec, opts); err != nil {
		return nil, err
	}
	replacements, err := adoptPinnedMaps(nicSpec, mapsDir(opts.PinRoot), opts, log)
	if err != nil {
		return nil, err
	}

	coll, err := ebpf.NewCollectionWithOptions(nicSpec, ebpf.CollectionOptions{
		Maps:            ebpf.MapOptions{PinPath: mapsDir(opts.PinRoot)},
		MapReplacements: replacements.byName(),
	})
	if err != nil {
		replacements.Close()
		return nil, explainBPFError("load XDP program", verifierDetail(err))
	}
	defer coll.Close()

	d := &Datapath{dir: Dir(opts.PinRoot), opts: opts, log: log, replacements: replacements}
	for name, handle := range d.Maps.byName() {
		m, ok := coll.Maps[name]
		if !ok {
			d.Close()
			return nil, fmt.Errorf("XDP object has no map %q", name)
		}
		if *handle, err = m.Clone(); err != nil {
			d.Close()
			return nil, fmt.Errorf("map %s: %w", name, err)
		}
	}
	if d.nic, err = coll.Programs["xdplb_nic"].Clone(); err != nil {
		d.Close()
		return nil, fmt.Errorf("XDP program: %w", err)
	}

	if d.nicIngress, err = loadSharing(ingressSpec, nicSpec, coll, "xdplb_nic_ingress"); err != nil {
		d.Close()
		return nil, explainBPFError("load TC program", err)
	}
	if d.pod, err = loadSharing(podSpec, nicSpec, coll, "xdplb_pod"); err != nil {
		d.Close()
		return nil, explainBPFError("load pod TC program", err)
	}
	if d.hostReply, err = loadSharing(hostReplySpec, nicSpec, coll, "xdplb_host_reply"); err != nil {
		d.Close()
		return nil, explainBPFError("load host reply TC program", err)
	}
	if d.sock, err = loadCollectionSharing(sockSpec, nicSpec, coll); err != nil {
		d.Close()
		return nil, explainBPFError("load socket programs", err)
	}

	if err := d.writeConfig(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// loadSharing loads the program prog of spec, with every map it shares
// with the XDP object replaced by the XDP collection's (pinned) map.
func loadSharing(spec, nicSpec *ebpf.CollectionSpec, coll *ebpf.Collection, prog string) (*ebpf.Program, error) {
	c, err := loadCollectionSharing(spec, nicSpec, coll)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	p, ok := c.Programs[prog]
	if !ok {
		return nil, fmt.Errorf("object has no program %q", prog)
	}
	return p.Clone()
}

// loadCollectionSharing loads spec with the maps it shares with the XDP
// object replaced by the XDP collection's (pinned) maps.
func loadCollectionSharing(spec, nicSpec *ebpf.CollectionSpec, coll *ebpf.Collection) (*ebpf.Collection, error) {
	replacements := map[string]*ebpf.Map{}
	for name, ms := range spec.Maps {
		m, ok := coll.Maps[name]
		if !ok || nicSpec.Maps[name].Pinning != ebpf.PinByName {
			continue
		}
		ms.Pinning = ebpf.PinNone
		ms.MaxEntries = nicSpec.Maps[name].MaxEntries
		replacements[name] = m
	}
	c, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: replacements})
	if err != nil {
		return nil, verifierDetail(err)
	}
	return c, nil
}

// Close releases the loader's file descriptors. Attached programs and
// pinned maps stay in the kernel. Without CommitPins, the pins keep naming
// the maps they named before Load, and the replacement maps are freed.
func (d *Datapath) Close() error {
	var errs []error
	d.forgetRevertSteps()
	if d.replacements != nil {
		d.replacements.Close()
		d.replacements = nil
	}
	errs = append(errs, d.Maps.Close())
	for _, p := range []*ebpf.Program{d.nic, d.nicIngress, d.pod, d.hostReply} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	if d.sock != nil {
		d.sock.Close()
	}
	return errors.Join(errs...)
}

// XDPProgram returns the loaded XDP program (for tests and benchmarks).
func (d *Datapath) XDPProgram() *ebpf.Program { return d.nic }

// TCProgram returns the loaded TC ingress program of the NIC.
func (d *Datapath) TCProgram() *ebpf.Program { return d.nicIngress }

// PodProgram returns the loaded TC program of pod interfaces.
func (d *Datapath) PodProgram() *ebpf.Program { return d.pod }

// HostReplyProgram returns the loaded TC egress program of the NIC and pod
// interfaces.
func (d *Datapath) HostReplyProgram() *ebpf.Program { return d.hostReply }

// Options returns the options the datapath was loaded with.
func (d *Datapath) Options() Options { return d.opts }

// writeConfig writes the datapath configuration, keeping what it
// overwrites for Revert.
func (d *Datapath) writeConfig() error {
	if err := d.Maps.Config.Lookup(uint32(0), &d.earlierConfig); err != nil {
		return fmt.Errorf("read datapath config: %w", err)
	}
	cfg := xdp.DatapathConfig{
		TcpEstablishedTimeoutNs: uint64(d.opts.TCPEstablishedTimeout.Nanoseconds()),
		TcpTransientTimeoutNs:   uint64(d.opts.TCPTransientTimeout.Nanoseconds()),
		UdpTimeoutNs:            uint64(d.opts.UDPTimeout.Nanoseconds()),
		HashSeed:                d.opts.HashSeed,
		SnatPortMin:             d.opts.SNATPorts[0].Min,
		SnatPortMax:             d.opts.SNATPorts[0].Max,
		SnatPort2Min:            d.opts.SNATPorts[1].Min,
		SnatPort2Len:            uint16(d.opts.SNATPorts[1].Len()),
		SnatSocketCheckBelow:    d.opts.SNATSocketCheckBelow,
		HairpinAddr:             xdp.AddrToNet(d.opts.HairpinAddr),
		SnatBuckets:             d.opts.SNATBuckets(),
		NetnsCookie:             netnsCookie(),
		IcmpIntervalNs:          icmpInterval(d.opts.ICMPRate),
		SynCookies:              uint32(d.opts.SYNCookies),
		SynFloodThreshold:       d.opts.SYNFloodThreshold,
		// SnatSpillsMarked stays 0: the datapath may run over maps an
		// older version spilled into without marking; the agent lets it
		// trust the marks once it has checked (dataplane.TrustSNATSpillMarks).
	}
	if err := d.Maps.Config.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("write datapath config: %w", err)
	}
	return nil
}

// icmpInterval is the spacing of ICMP errors at rate a second (0: none).
func icmpInterval(rate uint32) uint32 {
	if rate == 0 {
		return 0
	}
	return uint32(time.Second) / rate
}

// sizeMaps sets every map's capacity from the options.
func sizeMaps(spec *ebpf.CollectionSpec, opts Options) error {
	sizes := map[string]uint32{
		"frontends":          opts.FrontendsMax,
		"backends":           opts.BackendsMax,
		"maglev_tables":      2 * opts.ServicesMax, // a cluster-wide and a node-local table per service port
		"source_ranges":      opts.SourceRangesMax,
		"conntrack":          opts.ConntrackMax,
		"ct_unconfirmed":     opts.UnconfirmedFlows(),
		"synproxy_flows":     opts.ConntrackMax, // a flow opened under a SYN flood lives as long as any
		"syn_floods":         opts.ServicesMax,
		"nat":                opts.NATMax,
		"nat_unconfirmed":    opts.UnconfirmedFlows(),
		"snat_slots":         opts.SNATSlots(),
		"snat_bucket_hands":  opts.SNATBuckets(),
		"snat_backend_hands": opts.BackendsMax,
		"affinity":           opts.AffinityMax,
		"svc_stats":          opts.ServicesMax,
		"svc_names":          opts.ServicesMax,
	}
	for name, size := range sizes {
		m, ok := spec.Maps[name]
		if !ok {
			return fmt.Errorf("XDP object has no map %q", name)
		}
		m.MaxEntries = size
	}
	return nil
}

// verifierDetail keeps the end of a verifier log, where the reason is.
func verifierDetail(err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		lines := ve.Log
		if len(lines) > 20 {
			lines = lines[len(lines)-20:]
		}
		return fmt.Errorf("%w\n%s", err, strings.Join(lines, "\n"))
	}
	return err
}
