package xdp

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf/btf"
)

// StatNames returns the datapath counter names indexed by Stat, taken
// from the enum in the embedded object's BTF so they can never drift from
// the C source: "STAT_DROP_NAT_EXHAUSTED" becomes "drop_nat_exhausted".
func StatNames() ([]string, error) {
	spec, err := LoadNic()
	if err != nil {
		return nil, fmt.Errorf("read embedded XDP object: %w", err)
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("stat", &enum); err != nil {
		return nil, fmt.Errorf("enum stat in BTF: %w", err)
	}
	names := make([]string, StatSTAT_MAX)
	for _, v := range enum.Values {
		if v.Value >= uint64(StatSTAT_MAX) {
			continue
		}
		names[v.Value] = strings.ToLower(strings.TrimPrefix(v.Name, "STAT_"))
	}
	for i, n := range names {
		if n == "" {
			return nil, fmt.Errorf("counter %d has no name in BTF", i)
		}
	}
	return names, nil
}
