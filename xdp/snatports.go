package xdp

import (
	"fmt"
	"strconv"
	"strings"
)

// PortRange is an inclusive range of ports; Max 0 is the empty range.
type PortRange struct {
	Min, Max uint16
}

// Len is how many ports r holds.
func (r PortRange) Len() uint32 {
	if r.Max == 0 || r.Max < r.Min {
		return 0
	}
	return uint32(r.Max) - uint32(r.Min) + 1
}

// Contains says whether port is in r.
func (r PortRange) Contains(port uint16) bool {
	return r.Len() > 0 && port >= r.Min && port <= r.Max
}

func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Min, r.Max) }

// SNATPorts is the SNAT source port space: a first range and an optional
// second one, their ports numbered one after the other (snat_port_offset
// in include/snat.h). A bucket of snat_slots holds one slot per number.
type SNATPorts [2]PortRange

// SNATPortsOf reads the SNAT ports of a datapath configuration.
func SNATPortsOf(cfg *DatapathConfig) SNATPorts {
	p := SNATPorts{{cfg.SnatPortMin, cfg.SnatPortMax}}
	if cfg.SnatPort2Len > 0 {
		p[1] = PortRange{cfg.SnatPort2Min, uint16(uint32(cfg.SnatPort2Min) + uint32(cfg.SnatPort2Len) - 1)}
	}
	return p
}

// Len is how many SNAT ports there are.
func (p SNATPorts) Len() uint32 { return p[0].Len() + p[1].Len() }

// Contains says whether port is a SNAT port.
func (p SNATPorts) Contains(port uint16) bool { return p[0].Contains(port) || p[1].Contains(port) }

// Offset is the number of a SNAT port, and false for a port that is not one.
func (p SNATPorts) Offset(port uint16) (uint32, bool) {
	switch {
	case p[0].Contains(port):
		return uint32(port - p[0].Min), true
	case p[1].Contains(port):
		return p[0].Len() + uint32(port-p[1].Min), true
	}
	return 0, false
}

// Port is the SNAT port numbered offset (below Len).
func (p SNATPorts) Port(offset uint32) uint16 {
	if offset < p[0].Len() {
		return p[0].Min + uint16(offset)
	}
	return p[1].Min + uint16(offset-p[0].Len())
}

// Ranges is the non-empty ranges, first first.
func (p SNATPorts) Ranges() []PortRange {
	var out []PortRange
	for _, r := range p {
		if r.Len() > 0 {
			out = append(out, r)
		}
	}
	return out
}

// String formats p as the --snat-port-range flag takes it: LOW-HIGH, or
// LOW-HIGH,LOW-HIGH.
func (p SNATPorts) String() string {
	parts := make([]string, 0, 2)
	for _, r := range p.Ranges() {
		parts = append(parts, r.String())
	}
	return strings.Join(parts, ",")
}

// ParseSNATPorts parses LOW-HIGH or LOW-HIGH,LOW-HIGH. The ranges must be
// in increasing order and apart; what ports are acceptable beyond that is
// the caller's to check.
func ParseSNATPorts(s string) (SNATPorts, error) {
	var p SNATPorts
	parts := strings.Split(s, ",")
	if len(parts) > len(p) {
		return p, fmt.Errorf("%d ranges, at most %d are supported", len(parts), len(p))
	}
	for i, part := range parts {
		lo, hi, ok := strings.Cut(strings.TrimSpace(part), "-")
		if !ok {
			return p, fmt.Errorf("%q is not LOW-HIGH", part)
		}
		min, err := strconv.ParseUint(lo, 10, 16)
		if err != nil {
			return p, fmt.Errorf("%q: low port: %w", part, err)
		}
		max, err := strconv.ParseUint(hi, 10, 16)
		if err != nil {
			return p, fmt.Errorf("%q: high port: %w", part, err)
		}
		if min == 0 || min > max {
			return p, fmt.Errorf("%q is empty", part)
		}
		p[i] = PortRange{uint16(min), uint16(max)}
	}
	if p[1].Len() > 0 && p[1].Min <= p[0].Max {
		return p, fmt.Errorf("%s and %s overlap or are out of order: give the lower range first", p[0], p[1])
	}
	return p, nil
}

// SNATSlot is the index in the snat_slots map of SNAT port `port` of a
// bucket (snat_slot_in in include/snat.h): buckets are copies of the SNAT
// port space, one after the other. The port must be one of ports.
func SNATSlot(bucket uint32, port uint16, ports SNATPorts) uint32 {
	offset, _ := ports.Offset(port)
	return bucket*ports.Len() + offset
}
