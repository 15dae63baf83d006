package dataplane

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// InnerTablesMemory is MapMemory's name for the inner Maglev tables,
// counted together.
const InnerTablesMemory = "maglev_inner_tables"

// MapMemory returns the kernel memory each sized map takes, as the kernel
// charges it to the memory cgroup of the process that created it (the
// memlock figure of the map's fdinfo), and the inner Maglev tables'
// together (InnerTablesMemory), which grow with the Services. Reading the
// inner tables opens each by id: on 10k Services it takes some 10k
// system calls.
func (d *Dataplane) MapMemory() (map[string]uint64, error) {
	out := map[string]uint64{}
	for name, m := range d.sizedMaps() {
		n, err := mapMemlock(m)
		if err != nil {
			return nil, fmt.Errorf("map %s: %w", name, err)
		}
		out[name] = n
	}
	var inner uint64
	var errs []error
	seen := map[uint32]bool{}
	err := d.eachTable(func(id, innerID uint32) {
		if seen[innerID] {
			return
		}
		seen[innerID] = true
		m, err := ebpf.NewMapFromID(ebpf.MapID(innerID))
		if errors.Is(err, os.ErrNotExist) {
			return // replaced since the walk read it
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("table %d: %w", id, err))
			return
		}
		defer m.Close()
		n, err := mapMemlock(m)
		if err != nil {
			errs = append(errs, fmt.Errorf("table %d: %w", id, err))
			return
		}
		inner += n
	})
	if err = errors.Join(append(errs, err)...); err != nil {
		return nil, fmt.Errorf("inner Maglev tables: %w", err)
	}
	out[InnerTablesMemory] = inner
	return out, nil
}

// mapMemlock reads the memlock line of a map's fdinfo: the bytes the
// kernel charges for it.
func mapMemlock(m *ebpf.Map) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/self/fdinfo/%d", m.FD()))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "memlock:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("fdinfo has no memlock line")
}
