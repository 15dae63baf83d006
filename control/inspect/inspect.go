// Package inspect answers operators' questions from the pinned datapath
// maps alone: what is attached, which services and backends are
// programmed, which flows are tracked, and where a new flow would go. It
// works while an agent runs and after it stopped.
package inspect

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/xdp"
)

// Open opens the datapath pinned under pinRoot.
func Open(pinRoot string) (*dataplane.Dataplane, error) {
	m, err := loader.OpenPinned(pinRoot)
	if err != nil {
		return nil, err
	}
	return dataplane.New(m), nil
}

// Attachment is one program attached to an interface.
type Attachment struct {
	Interface string `json:"interface"`
	Hook      string `json:"hook"` // "xdp", "tc-ingress" (NIC), "tc-pod" (pod interface) or "cgroup" (host sockets)
	Mode      string `json:"mode"` // native, generic, tcx
	ProgramID uint32 `json:"programId"`
	Program   string `json:"program"`
	LinkID    uint32 `json:"linkId"`
	// ThisBuild: the attached program is the one this binary carries
	// (false after an upgrade until the new agent has run).
	ThisBuild bool `json:"thisBuild"`
}

// MapUse is the fill level of one map.
type MapUse struct {
	Name     string  `json:"name"`
	Entries  int     `json:"entries"`
	Capacity uint32  `json:"capacity"`
	Percent  float64 `json:"percent"`
}

// Status is the answer of `xdplb status`.
type Status struct {
	PinDir      string       `json:"pinDir"`
	Attachments []Attachment `json:"attachments"`
	Maps        []MapUse     `json:"maps"`
	AgentPID    uint32       `json:"agentPid,omitempty"`
	AgentAlive  bool         `json:"agentAlive"`
	Started     *time.Time   `json:"started,omitempty"`
	LastSync    *time.Time   `json:"lastSync,omitempty"`
	Syncs       uint64       `json:"syncs"`
	Services    uint32       `json:"servicePorts"`
	Problems    uint32       `json:"problems"`
	Datapath    Settings     `json:"datapath"`
	Counters    []Counter    `json:"counters"`
	// Flood is set while new flows displace each other (see Flood).
	Flood *Flood `json:"flood,omitempty"`
	// SYNCookiePorts are the service ports whose SYNs are answered with
	// SYN cookies now, for a SYN flood (Datapath.SYNCookies "auto").
	SYNCookiePorts []string `json:"synCookiePorts,omitempty"`
}

// FloodPercent is how full the table of unconfirmed flows is when status
// reports a flood: new flows, spoofed or not, then evict each other
// (confirmed flows are safe in their own table). An LRU map under churn
// never counts all its entries (each CPU keeps some free), least of all a
// small one: a table of 1024 flooded with ten times that counts 80-90%.
const FloodPercent = 75

// FloodPortsShown is how many service ports a flood report names.
const FloodPortsShown = 5

// Flood is a flood of new flows: the table of unconfirmed flows is at
// least FloodPercent full. Ports are the service ports with the most
// unconfirmed flows, most first, at most FloodPortsShown.
type Flood struct {
	Percent float64     `json:"percent"`
	Ports   []FloodPort `json:"servicePorts"`
}

// FloodPort is a service port's share of the unconfirmed flows.
type FloodPort struct {
	Service     string `json:"service"`
	Unconfirmed int    `json:"unconfirmedFlows"`
}

// Settings are the datapath's run-time settings, as the agent wrote them
// from its flags.
type Settings struct {
	HashSeed              uint32 `json:"hashSeed"`
	SNATPorts             string `json:"snatPorts"`
	TCPEstablishedTimeout string `json:"tcpEstablishedTimeout"`
	TCPTransientTimeout   string `json:"tcpTransientTimeout"`
	UDPTimeout            string `json:"udpTimeout"`
	// ICMPErrorInterval is the spacing of the ICMP port unreachables the
	// datapath builds, per CPU after a burst ("none": not limited).
	ICMPErrorInterval string `json:"icmpErrorInterval"`
	// NewFlowRouteReuse: an agent found that the node routes by
	// destination alone, so new flows reuse their backend's route (its
	// lease runs out when no agent renews it).
	NewFlowRouteReuse bool `json:"newFlowRouteReuse"`
	// SYNCookies is when SYNs to external frontends are answered with
	// SYN cookies: off, always, or auto, from SYNFloodThreshold
	// handshakes a service port left incomplete within a second.
	SYNCookies        string `json:"synCookies"`
	SYNFloodThreshold uint32 `json:"synFloodThreshold,omitempty"`
}

// Counter is one datapath counter.
type Counter struct {
	Name    string `json:"name"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// GetStatus gathers the status.
func GetStatus(pinRoot string, dp *dataplane.Dataplane) (Status, error) {
	st := Status{PinDir: loader.Dir(pinRoot)}
	atts, err := attachments(pinRoot)
	if err != nil {
		return st, err
	}
	st.Attachments = atts
	occ, err := dp.Occupancy()
	if err != nil {
		return st, err
	}
	for name, cap := range dp.Capacities() {
		u := MapUse{Name: name, Entries: occ[name], Capacity: cap}
		if cap > 0 {
			u.Percent = 100 * float64(u.Entries) / float64(cap)
		}
		st.Maps = append(st.Maps, u)
	}
	slices.SortFunc(st.Maps, func(a, b MapUse) int { return cmp.Compare(a.Name, b.Name) })
	if st.Flood, err = flood(dp, st.Maps); err != nil {
		return st, err
	}
	as, err := dp.AgentState()
	if err != nil {
		return st, err
	}
	st.AgentPID, st.Syncs, st.Services, st.Problems = as.PID, as.Syncs, as.ServicePorts, as.Problems
	if !as.Started.IsZero() {
		st.Started = &as.Started
	}
	if !as.LastSync.IsZero() {
		st.LastSync = &as.LastSync
	}
	if pid, alive := findAgent(as.PID, as.PIDNamespace); alive {
		st.AgentPID, st.AgentAlive = pid, true
	}
	cfg, err := datapathConfig(dp)
	if err != nil {
		return st, err
	}
	st.Datapath = Settings{
		HashSeed:              cfg.HashSeed,
		SNATPorts:             xdp.SNATPortsOf(&cfg).String(),
		TCPEstablishedTimeout: time.Duration(cfg.TcpEstablishedTimeoutNs).String(),
		TCPTransientTimeout:   time.Duration(cfg.TcpTransientTimeoutNs).String(),
		UDPTimeout:            time.Duration(cfg.UdpTimeoutNs).String(),
		ICMPErrorInterval:     "none",
		SYNCookies:            loader.SYNCookieMode(cfg.SynCookies).String(),
	}
	if loader.SYNCookieMode(cfg.SynCookies) == loader.SYNCookiesAuto {
		st.Datapath.SYNFloodThreshold = cfg.SynFloodThreshold
		if st.SYNCookiePorts, err = synCookiePorts(dp, cfg.SynFloodThreshold); err != nil {
			return st, err
		}
	}
	if st.Datapath.NewFlowRouteReuse, err = dp.RouteReuseAllowed(); err != nil {
		return st, err
	}
	if cfg.IcmpIntervalNs != 0 {
		st.Datapath.ICMPErrorInterval = time.Duration(cfg.IcmpIntervalNs).String()
	}
	names, err := xdp.StatNames()
	if err != nil {
		return st, err
	}
	cs, err := dp.Counters()
	if err != nil {
		return st, err
	}
	for i, c := range cs {
		if c.Packets > 0 {
			st.Counters = append(st.Counters, Counter{Name: names[i], Packets: c.Packets, Bytes: c.Bytes})
		}
	}
	return st, nil
}

// RunningAgent reports the agent that recorded itself in the datapath
// pinned under pinRoot, if it still runs: its pid, or 0.
func RunningAgent(pinRoot string) uint32 {
	dp, err := Open(pinRoot)
	if err != nil {
		return 0 // nothing pinned (or unreadable): no agent on these pins
	}
	defer dp.Maps().Close()
	as, err := dp.AgentState()
	if err != nil {
		return 0
	}
	pid, alive := findAgent(as.PID, as.PIDNamespace)
	if !alive {
		return 0
	}
	return pid
}

// findAgent looks for the agent recorded as pid in the pid namespace whose
// inode is ns (0: not recorded, taken as this process's own) and returns
// its pid as this process sees it. The agent of a DaemonSet runs in its
// pod's namespace, often as pid 1: seen from the node it is the process in
// that namespace whose innermost pid (NSpid in /proc/<pid>/status) is pid.
// An agent in a namespace this process cannot see is not found.
func findAgent(pid, ns uint32) (uint32, bool) {
	if pid == 0 {
		return 0, false
	}
	if ns == 0 || ns == dataplane.PIDNamespaceOf("self") {
		return pid, agentAlive(pid)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range entries {
		local, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || dataplane.PIDNamespaceOf(e.Name()) != ns || innermostPID(e.Name()) != pid {
			continue
		}
		return uint32(local), agentAlive(uint32(local))
	}
	return 0, false
}

// innermostPID returns a process's pid in its own pid namespace, the last
// of the NSpid line of /proc/<pid>/status; 0 if it cannot be read.
func innermostPID(pid string) uint32 {
	raw, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				return 0
			}
			n, err := strconv.ParseUint(fields[len(fields)-1], 10, 32)
			if err != nil {
				return 0
			}
			return uint32(n)
		}
	}
	return 0
}

// agentAlive reports whether pid (in this process's pid namespace) is a
// running xdplb agent. The pid alone is not enough: after the agent
// stopped, another process may get it.
func agentAlive(pid uint32) bool {
	if pid == 0 {
		return false
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	return len(args) > 1 && strings.Contains(filepath.Base(args[0]), "xdplb") && slices.Contains(args[1:], "agent")
}

// LinkNames lists the pinned links under pinRoot by their names alone
// (interface, hook and mode; see loader.ParseLinkPin), without opening
// them.
func LinkNames(pinRoot string) ([]Attachment, error) {
	dir := filepath.Join(loader.Dir(pinRoot), "links")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Attachment
	for _, e := range entries {
		pin, ok := loader.ParseLinkPin(e.Name())
		if !ok {
			continue
		}
		a := Attachment{Hook: pin.Hook, Mode: pin.Mode, Interface: pin.Ifname}
		if pin.Hook == loader.HookCgroup {
			a.Interface = "(cgroup)"
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Attachment) int {
		return cmp.Or(cmp.Compare(a.Interface, b.Interface), cmp.Compare(a.Hook, b.Hook))
	})
	return out, nil
}

// linkPin is the pinned link an Attachment was read from.
func linkPin(a Attachment) loader.LinkPin {
	pin := loader.LinkPin{Hook: a.Hook, Mode: a.Mode, Ifname: a.Interface}
	if a.Hook == loader.HookCgroup {
		pin.Ifname = ""
	}
	return pin
}

// attachments reads the pinned links.
func attachments(pinRoot string) ([]Attachment, error) {
	dir := filepath.Join(loader.Dir(pinRoot), "links")
	names, err := LinkNames(pinRoot)
	if err != nil {
		return nil, err
	}
	specs, err := embeddedPrograms()
	if err != nil {
		return nil, err
	}
	var out []Attachment
	for _, a := range names {
		name := linkPin(a).Name()
		l, err := link.LoadPinnedLink(filepath.Join(dir, name), nil)
		if err != nil {
			return nil, fmt.Errorf("open pinned link %s: %w", name, err)
		}
		if info, err := l.Info(); err == nil {
			a.LinkID = uint32(info.ID)
			a.ProgramID = uint32(info.Program)
			if p, err := ebpf.NewProgramFromID(info.Program); err == nil {
				if pi, err := p.Info(); err == nil {
					a.Program = pi.Name
					if spec, ok := specs[pi.Name]; ok {
						a.ThisBuild = spec.Compatible(pi) == nil
					}
				}
				p.Close()
			}
		}
		l.Close()
		out = append(out, a)
	}
	return out, nil
}

// embeddedPrograms returns the BPF programs this binary carries, by name.
func embeddedPrograms() (map[string]*ebpf.ProgramSpec, error) {
	out := map[string]*ebpf.ProgramSpec{}
	for _, load := range xdp.DatapathObjects() {
		spec, err := load()
		if err != nil {
			return nil, fmt.Errorf("read embedded BPF object: %w", err)
		}
		for name, p := range spec.Programs {
			// Resolve bpf-to-bpf call and callback offsets as loading
			// does, or the tag of a program with subprograms (bpf_loop
			// callbacks) would never match the kernel's. The embedded
			// objects are little-endian (bpfel).
			if err := p.Instructions.Marshal(io.Discard, binary.LittleEndian); err != nil {
				return nil, fmt.Errorf("encode embedded program %s: %w", name, err)
			}
			out[name] = p
		}
	}
	return out, nil
}

// BackendUse is a backend and its share of a table.
type BackendUse struct {
	ID          uint32 `json:"id"`
	Address     string `json:"address"`
	Local       bool   `json:"local"`
	Host        bool   `json:"host,omitempty"` // at an address of this node
	Terminating bool   `json:"terminating"`
	Slots       int    `json:"slots"`
}

// Frontend is one row of `xdplb services`.
type Frontend struct {
	Frontend        string       `json:"frontend"`
	Service         string       `json:"service"`
	ServiceID       uint32       `json:"serviceId"`
	External        bool         `json:"external"`
	SNAT            bool         `json:"snat"`
	SourceRanges    bool         `json:"sourceRanges"`
	AffinitySeconds uint32       `json:"affinitySeconds,omitempty"`
	TableID         uint32       `json:"tableId"`
	TableSize       int          `json:"tableSize"`
	WhenEmpty       string       `json:"whenEmpty,omitempty"` // reject or drop
	Backends        []BackendUse `json:"backends"`
}

// Services lists frontends with their service ports and backends.
func Services(dp *dataplane.Dataplane) ([]Frontend, error) {
	fes, err := dp.Frontends()
	if err != nil {
		return nil, err
	}
	names, err := dp.ServiceNames()
	if err != nil {
		return nil, err
	}
	bes, err := dp.Backends()
	if err != nil {
		return nil, err
	}
	tables := map[uint32][]uint32{}
	var out []Frontend
	for k, v := range fes {
		f := Frontend{
			Frontend: k.String(), Service: names[v.SvcID], ServiceID: v.SvcID,
			External:        v.Flags&dataplane.FrontendExternal != 0,
			SNAT:            v.Flags&dataplane.FrontendSNATRemote != 0,
			SourceRanges:    v.Flags&dataplane.FrontendSourceRanges != 0,
			AffinitySeconds: v.AffinityTimeout,
			TableID:         v.TableID,
		}
		if f.Service == "" {
			f.Service = fmt.Sprintf("#%d", v.SvcID)
		}
		if v.TableID == 0 {
			f.Backends = []BackendUse{}
			f.WhenEmpty = "reject"
			if v.Flags&dataplane.FrontendDropIfEmpty != 0 {
				f.WhenEmpty = "drop"
			}
		} else {
			slots, ok := tables[v.TableID]
			if !ok {
				if slots, err = dp.Table(v.TableID); err != nil {
					return nil, err
				}
				tables[v.TableID] = slots
			}
			f.TableSize = len(slots)
			f.Backends = backendUse(slots, bes)
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b Frontend) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.Frontend, b.Frontend))
	})
	return out, nil
}

func backendUse(slots []uint32, bes map[uint32]dataplane.Backend) []BackendUse {
	count := map[uint32]int{}
	for _, s := range slots {
		count[s]++
	}
	var out []BackendUse
	for id, n := range count {
		b := bes[id]
		out = append(out, BackendUse{ID: id, Address: b.String(), Local: b.Local, Host: b.Host,
			Terminating: b.Terminating, Slots: n})
	}
	slices.SortFunc(out, func(a, b BackendUse) int { return cmp.Compare(a.Address, b.Address) })
	return out
}

// ParseProto accepts tcp or udp.
func ParseProto(s string) (uint8, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return dataplane.TCP, nil
	case "udp":
		return dataplane.UDP, nil
	}
	return 0, fmt.Errorf("protocol %q: allowed values are tcp, udp", s)
}

// ParseAddrPort parses IP:PORT (IPv4).
func ParseAddrPort(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil || !ap.Addr().Is4() {
		return netip.AddrPort{}, fmt.Errorf("%q: want IPv4:PORT", s)
	}
	return ap, nil
}

// servicePortName is a service port's name from names, or its id when
// it has none.
func servicePortName(names map[uint32]string, id uint32) string {
	if name := names[id]; name != "" {
		return name
	}
	return fmt.Sprintf("service port %d", id)
}

// synCookiePorts names the service ports whose SYNs are answered with
// cookies now.
func synCookiePorts(dp *dataplane.Dataplane, threshold uint32) ([]string, error) {
	ids, err := dp.SYNCookiePorts(threshold, dataplane.Now())
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	names, err := dp.ServiceNames()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, id := range ids {
		out = append(out, servicePortName(names, id))
	}
	slices.Sort(out)
	return out, nil
}

// flood reports a flood of new flows when the table of unconfirmed flows
// is at least FloodPercent full (nil otherwise), with the service ports
// that hold most of it.
func flood(dp *dataplane.Dataplane, maps []MapUse) (*Flood, error) {
	i := slices.IndexFunc(maps, func(m MapUse) bool { return m.Name == "ct_unconfirmed" })
	if i < 0 || maps[i].Percent < FloodPercent {
		return nil, nil
	}
	names, err := dp.ServiceNames()
	if err != nil {
		return nil, err
	}
	perPort := map[uint32]int{}
	err = dp.Flows(func(f dataplane.Flow) bool {
		if f.Unconfirmed {
			perPort[f.SvcID]++
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	fl := &Flood{Percent: maps[i].Percent}
	for id, n := range perPort {
		fl.Ports = append(fl.Ports, FloodPort{Service: servicePortName(names, id), Unconfirmed: n})
	}
	slices.SortFunc(fl.Ports, func(a, b FloodPort) int {
		return cmp.Or(cmp.Compare(b.Unconfirmed, a.Unconfirmed), cmp.Compare(a.Service, b.Service))
	})
	fl.Ports = fl.Ports[:min(len(fl.Ports), FloodPortsShown)]
	return fl, nil
}
