package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

func sourceRangeKey(svcID uint32, p netip.Prefix) xdp.SourceRangeKey {
	var id [4]byte
	binary.BigEndian.PutUint32(id[:], svcID)
	return xdp.SourceRangeKey{
		Prefixlen: 32 + uint32(p.Bits()),
		SvcId:     binary.NativeEndian.Uint32(id[:]),
		Addr:      xdp.AddrToNet(p.Masked().Addr()),
	}
}

// PutSourceRange allows clients in p to reach the service port's
// LoadBalancer frontends (those flagged FrontendSourceRanges).
func (d *Dataplane) PutSourceRange(svcID uint32, p netip.Prefix) error {
	if !p.Addr().Is4() {
		return fmt.Errorf("source range %s: not IPv4", p)
	}
	if err := d.m.SourceRanges.Put(sourceRangeKey(svcID, p), uint8(1)); err != nil {
		return fmt.Errorf("source range %s of service %d: %w", p, svcID, err)
	}
	return nil
}

// DeleteSourceRange removes an allowed range.
func (d *Dataplane) DeleteSourceRange(svcID uint32, p netip.Prefix) error {
	err := d.m.SourceRanges.Delete(sourceRangeKey(svcID, p))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete source range %s of service %d: %w", p, svcID, err)
	}
	return nil
}

// SourceRange is an allowed client range of a service port.
type SourceRange struct {
	SvcID  uint32
	Prefix netip.Prefix
}

// SourceRanges lists every allowed range.
func (d *Dataplane) SourceRanges() ([]SourceRange, error) {
	var out []SourceRange
	var k xdp.SourceRangeKey
	var v uint8
	it := d.m.SourceRanges.Iterate()
	for it.Next(&k, &v) {
		var id [4]byte
		binary.NativeEndian.PutUint32(id[:], k.SvcId)
		out = append(out, SourceRange{
			SvcID:  binary.BigEndian.Uint32(id[:]),
			Prefix: netip.PrefixFrom(xdp.NetToAddr(k.Addr), int(k.Prefixlen)-32),
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read source ranges: %w", err)
	}
	return out, nil
}
