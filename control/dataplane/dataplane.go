// Package dataplane reads and writes the datapath's pinned maps in terms of
// plain Go values (addresses, ports, flags) instead of raw map entries. The
// reconciler programs services through it, the CLI inspects flows through
// it, and tests set up fixtures with it.
package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/xdp"
)

// Protocol numbers used in frontends and flows.
const (
	TCP uint8 = unix.IPPROTO_TCP
	UDP uint8 = unix.IPPROTO_UDP
)

// ProtoName returns "tcp", "udp" or the number.
func ProtoName(p uint8) string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return fmt.Sprint(p)
}

// Dataplane wraps the datapath maps.
type Dataplane struct {
	m *loader.Maps
}

// New wraps maps opened by the loader (loader.Load or loader.OpenPinned).
func New(m *loader.Maps) *Dataplane { return &Dataplane{m: m} }

// Maps returns the underlying maps.
func (d *Dataplane) Maps() *loader.Maps { return d.m }

// FrontendKey is an address, port and protocol that reaches a service port.
type FrontendKey struct {
	Addr  netip.Addr
	Port  uint16
	Proto uint8
}

func (k FrontendKey) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, k.Port), ProtoName(k.Proto))
}

func (k FrontendKey) raw() xdp.FrontendKey {
	return xdp.FrontendKey{Addr: xdp.AddrToNet(k.Addr), Port: xdp.PortToNet(k.Port), Proto: k.Proto}
}

func frontendKeyOf(r xdp.FrontendKey) FrontendKey {
	return FrontendKey{Addr: xdp.NetToAddr(r.Addr), Port: xdp.NetToPort(r.Port), Proto: r.Proto}
}

// Frontend flags (see enum frontend_flags in xdp/include/structs.h).
const (
	FrontendExternal     = uint16(xdp.FrontendFlagsFE_EXTERNAL)
	FrontendSNATRemote   = uint16(xdp.FrontendFlagsFE_SNAT_REMOTE)
	FrontendSourceRanges = uint16(xdp.FrontendFlagsFE_SOURCE_RANGES)
	FrontendDropIfEmpty  = uint16(xdp.FrontendFlagsFE_DROP_IF_EMPTY)
	// FrontendInternalDropIfEmpty: the same for traffic from this node.
	FrontendInternalDropIfEmpty = uint16(xdp.FrontendFlagsFE_INTERNAL_DROP_IF_EMPTY)
	// FrontendLocalSet: TableID is the node-local set; a ClientIP
	// affinity then returns only to a backend on this node.
	FrontendLocalSet = uint16(xdp.FrontendFlagsFE_LOCAL_SET)
	// FrontendInternalLocalSet: the same for InternalTableID.
	FrontendInternalLocalSet = uint16(xdp.FrontendFlagsFE_INTERNAL_LOCAL_SET)
)

// Frontend is what a frontend leads to.
type Frontend struct {
	SvcID uint32 // service port id
	// Maglev tables (0: no usable backend) for traffic from outside the
	// node and for traffic from this node's pods and host.
	TableID         uint32
	InternalTableID uint32
	AffinityTimeout uint32 // seconds; 0 without ClientIP affinity
	Flags           uint16
}

// PutFrontend creates or replaces a frontend, marking its port in the
// frontend port bitmap first so the datapath looks at the port.
func (d *Dataplane) PutFrontend(k FrontendKey, v Frontend) error {
	if err := d.setPortBit(k.Port, true); err != nil {
		return fmt.Errorf("frontend %s: %w", k, err)
	}
	raw := xdp.Frontend{SvcId: v.SvcID, TableId: v.TableID, InternalTableId: v.InternalTableID,
		AffinityTimeout: v.AffinityTimeout, Flags: v.Flags}
	if err := d.m.Frontends.Put(k.raw(), raw); err != nil {
		return fmt.Errorf("frontend %s: %w", k, err)
	}
	return nil
}

func (d *Dataplane) setPortBit(port uint16, on bool) error {
	word := uint32(port) / 64
	bit := uint64(1) << (port % 64)
	var bits uint64
	if err := d.m.FrontendPorts.Lookup(word, &bits); err != nil {
		return fmt.Errorf("read port bitmap: %w", err)
	}
	next := bits &^ bit
	if on {
		next = bits | bit
	}
	if next == bits {
		return nil
	}
	if err := d.m.FrontendPorts.Put(word, next); err != nil {
		return fmt.Errorf("write port bitmap: %w", err)
	}
	return nil
}

// portBitmap is a port bitmap as frontend_ports and host_backend_ports
// hold it: one bit per port, 64 ports to a word.
type portBitmap [65536 / 64]uint64

func (b *portBitmap) add(port uint16) { b[port/64] |= uint64(1) << (port % 64) }

// writeTo writes the words of m (a port bitmap map) that differ from b.
func (b *portBitmap) writeTo(m *ebpf.Map, what string) error {
	for word, want := range b {
		var have uint64
		if err := m.Lookup(uint32(word), &have); err != nil {
			return fmt.Errorf("read %s: %w", what, err)
		}
		if have != want {
			if err := m.Put(uint32(word), want); err != nil {
				return fmt.Errorf("write %s: %w", what, err)
			}
		}
	}
	return nil
}

// SetHostBackendPorts makes the host backend port bitmap hold exactly
// ports: those of the backends at an address of this node, whose replies
// the host reply program looks for.
func (d *Dataplane) SetHostBackendPorts(ports []uint16) error {
	var want portBitmap
	for _, p := range ports {
		want.add(p)
	}
	return want.writeTo(d.m.HostBackendPorts, "host backend port bitmap")
}

// SyncFrontendPorts makes the port bitmap hold exactly the ports of the
// current frontends. Call it after deleting frontends: a port stays marked
// while any frontend still uses it.
func (d *Dataplane) SyncFrontendPorts() error {
	fes, err := d.Frontends()
	if err != nil {
		return err
	}
	var want portBitmap
	for k := range fes {
		want.add(k.Port)
	}
	return want.writeTo(d.m.FrontendPorts, "port bitmap")
}

// DeleteFrontend removes a frontend; a missing one is not an error.
func (d *Dataplane) DeleteFrontend(k FrontendKey) error {
	if err := d.m.Frontends.Delete(k.raw()); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete frontend %s: %w", k, err)
	}
	return nil
}

// Frontends returns every frontend.
func (d *Dataplane) Frontends() (map[FrontendKey]Frontend, error) {
	out := map[FrontendKey]Frontend{}
	var k xdp.FrontendKey
	var v xdp.Frontend
	it := d.m.Frontends.Iterate()
	for it.Next(&k, &v) {
		out[frontendKeyOf(k)] = Frontend{SvcID: v.SvcId, TableID: v.TableId, InternalTableID: v.InternalTableId,
			AffinityTimeout: v.AffinityTimeout, Flags: v.Flags}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read frontends: %w", err)
	}
	return out, nil
}

// Backend is one endpoint address and port.
type Backend struct {
	Addr  netip.Addr
	Port  uint16
	Local bool // on this node
	// Host: at an address of this node (a hostNetwork pod here), always
	// Local too. Its packets are delivered to the node's stack.
	Host bool
	// Terminating: terminating or not ready (draining): keeps its
	// flows, gets no new ones unless its set has nothing better, and no
	// ClientIP affinity returns to it.
	Terminating bool
}

func (b Backend) String() string { return netip.AddrPortFrom(b.Addr, b.Port).String() }

func (b Backend) raw() xdp.Backend {
	var flags uint8
	if b.Local {
		flags |= uint8(xdp.BackendFlagsBE_LOCAL)
	}
	if b.Terminating {
		flags |= uint8(xdp.BackendFlagsBE_TERMINATING)
	}
	if b.Host {
		flags |= uint8(xdp.BackendFlagsBE_HOST)
	}
	return xdp.Backend{Addr: xdp.AddrToNet(b.Addr), Port: xdp.PortToNet(b.Port), Flags: flags}
}

func backendOf(r xdp.Backend) Backend {
	return Backend{
		Addr:        xdp.NetToAddr(r.Addr),
		Port:        xdp.NetToPort(r.Port),
		Local:       r.Flags&uint8(xdp.BackendFlagsBE_LOCAL) != 0,
		Terminating: r.Flags&uint8(xdp.BackendFlagsBE_TERMINATING) != 0,
		Host:        r.Flags&uint8(xdp.BackendFlagsBE_HOST) != 0,
	}
}

// PutBackend writes backend id. Id 0 is reserved ("none").
func (d *Dataplane) PutBackend(id uint32, b Backend) error {
	if id == 0 {
		return errors.New("backend id 0 is reserved")
	}
	if !b.Addr.Is4() {
		return fmt.Errorf("backend %d: %s is not an IPv4 address", id, b.Addr)
	}
	if err := d.m.Backends.Put(id, b.raw()); err != nil {
		return fmt.Errorf("backend %d (%s): %w", id, b, err)
	}
	return nil
}

// DeleteBackend frees backend id. Flows still pointing at it notice on
// their next packet.
func (d *Dataplane) DeleteBackend(id uint32) error {
	if err := d.m.Backends.Put(id, xdp.Backend{}); err != nil {
		return fmt.Errorf("delete backend %d: %w", id, err)
	}
	return nil
}

// Backends returns every backend in use, by id. The array is read in
// batches: one syscall per few thousand ids instead of one per id.
func (d *Dataplane) Backends() (map[uint32]Backend, error) {
	out := map[uint32]Backend{}
	const chunk = 4096
	keys := make([]uint32, chunk)
	vals := make([]xdp.Backend, chunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := d.m.Backends.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			if vals[i].Addr != 0 {
				out[keys[i]] = backendOf(vals[i])
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read backends: %w", err)
		}
	}
}

// BackendCapacity is the number of backend ids (including the reserved 0).
func (d *Dataplane) BackendCapacity() uint32 { return d.m.Backends.MaxEntries() }

// FrontendCapacity is the number of frontends the frontends map holds
// (--frontends-max).
func (d *Dataplane) FrontendCapacity() uint32 { return d.m.Frontends.MaxEntries() }

// SourceRangeCapacity is the number of source ranges the source ranges
// map holds (max(--services-max, 1024) in the agent).
func (d *Dataplane) SourceRangeCapacity() uint32 { return d.m.SourceRanges.MaxEntries() }

// batchChunk bounds one batch syscall.
const batchChunk = 4096

// PutBackends writes many backends at once (batched).
func (d *Dataplane) PutBackends(bes map[uint32]Backend) error {
	keys := make([]uint32, 0, len(bes))
	vals := make([]xdp.Backend, 0, len(bes))
	for id, b := range bes {
		if id == 0 || !b.Addr.Is4() {
			return fmt.Errorf("backend %d (%s): invalid", id, b)
		}
		keys = append(keys, id)
		vals = append(vals, b.raw())
	}
	for start := 0; start < len(keys); start += batchChunk {
		end := min(start+batchChunk, len(keys))
		if _, err := d.m.Backends.BatchUpdate(keys[start:end], vals[start:end], nil); err != nil {
			return fmt.Errorf("write %d backends: %w", end-start, err)
		}
	}
	return nil
}

// PutFrontends writes many frontends at once (batched), marking their
// ports in the bitmap first.
func (d *Dataplane) PutFrontends(fes map[FrontendKey]Frontend) error {
	words := map[uint32]uint64{}
	keys := make([]xdp.FrontendKey, 0, len(fes))
	vals := make([]xdp.Frontend, 0, len(fes))
	for k, v := range fes {
		words[uint32(k.Port)/64] |= uint64(1) << (k.Port % 64)
		keys = append(keys, k.raw())
		vals = append(vals, xdp.Frontend{SvcId: v.SvcID, TableId: v.TableID, InternalTableId: v.InternalTableID,
			AffinityTimeout: v.AffinityTimeout, Flags: v.Flags})
	}
	for word, bits := range words {
		var have uint64
		if err := d.m.FrontendPorts.Lookup(word, &have); err != nil {
			return fmt.Errorf("read port bitmap: %w", err)
		}
		if have|bits != have {
			if err := d.m.FrontendPorts.Put(word, have|bits); err != nil {
				return fmt.Errorf("write port bitmap: %w", err)
			}
		}
	}
	for start := 0; start < len(keys); start += batchChunk {
		end := min(start+batchChunk, len(keys))
		if _, err := d.m.Frontends.BatchUpdate(keys[start:end], vals[start:end], nil); err != nil {
			return fmt.Errorf("write %d frontends: %w", end-start, err)
		}
	}
	return nil
}
