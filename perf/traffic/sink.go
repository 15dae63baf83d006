package traffic

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/xdp"
	"github.com/xdplb/xdplb/xdp/baseline"
)

// Sink counts and drops every frame that arrives on one device (xdp_sink,
// attached in native mode).
type Sink struct {
	Dev  string
	objs baseline.XDPObjects
	link link.Link
}

// NewSink attaches a sink to dev in namespace ns.
func NewSink(ns *netns.NS, dev string) (*Sink, error) {
	s := &Sink{Dev: dev}
	if err := baseline.LoadXDPObjects(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("load sink program: %w", err)
	}
	l, err := AttachXDP(ns, dev, s.objs.XdpSink)
	if err != nil {
		s.objs.Close()
		return nil, err
	}
	s.link = l
	return s, nil
}

// Packets returns the frames counted so far.
func (s *Sink) Packets() (uint64, error) {
	var per []baseline.XDPSinkCounter
	if err := s.objs.SinkStats.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("read sink %s: %w", s.Dev, err)
	}
	var n uint64
	for _, c := range per {
		n += c.Packets
	}
	return n, nil
}

// PassTo hands frames to addr to the stack instead of counting them (the
// real connections of a scenario), except those whose TOS byte is
// dropTOS (generated traffic marked as such: see Spec.TOS). The zero
// address passes nothing again.
func (s *Sink) PassTo(addr netip.Addr, dropTOS uint8) error {
	pass := baseline.XDPSinkPass{DropTos: dropTOS}
	if addr.IsValid() {
		if !addr.Is4() {
			return fmt.Errorf("sink %s: pass to %s: IPv4 only", s.Dev, addr)
		}
		pass.Addr = xdp.AddrToNet(addr)
	}
	if err := s.objs.SinkPasses.Put(uint32(0), pass); err != nil {
		return fmt.Errorf("sink %s: pass to %s: %w", s.Dev, addr, err)
	}
	return nil
}

// Close detaches the sink.
func (s *Sink) Close() error {
	return errors.Join(s.link.Close(), s.objs.Close())
}

// AttachXDP attaches prog to dev in namespace ns in native mode; closing
// the link detaches it.
func AttachXDP(ns *netns.NS, dev string, prog *ebpf.Program) (link.Link, error) {
	var l link.Link
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifi.Index, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("attach %s to %s in %s: %w", prog, dev, ns.Name, err)
	}
	return l, nil
}
