package dataplane

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// PutTable installs a Maglev table (backend ids, one per slot) under id.
// The table is built in a new inner map and then swapped into the outer
// map in one update, so the datapath sees either the old table or the new
// one, never a mix.
func (d *Dataplane) PutTable(id uint32, slots []uint32) error {
	_, err := d.PutTables(context.Background(), []TableContent{{ID: id, Size: len(slots),
		Fill: func(dst []uint32) error { copy(dst, slots); return nil }}})
	return err
}

// TableContent is a Maglev table to install: Size slots, which Fill
// writes (backend ids) into dst, of length Size. PutTables calls Fill once,
// on the goroutine that installs the table, with a buffer that goroutine
// reuses, so a table can be computed where it is installed and need not
// be kept in memory before. A Fill error fails the installation.
type TableContent struct {
	ID   uint32
	Size int
	Fill func(dst []uint32) error
}

// tablesPerBatch bounds the inner maps (and file descriptors) held open
// at once by PutTables. Each batch ends in a munmap, a batch update and
// closing its maps, while the goroutines that fill tables wait: larger
// batches wait less often (512: ~0.1 s more of a 10k-table cold sync).
// Go raises the soft file limit to the hard one, which is far higher
// wherever the agent runs.
const tablesPerBatch = 2048

// PutTables installs many tables as PutTable does, each swapped in whole,
// with one batch update of the outer map per tablesPerBatch tables. The
// inner maps of a batch are filled through mappings placed side by side in
// one reserved range, so a single munmap (a TLB flush on every CPU) drops
// them all. It returns how many tables, from the start of tables, are
// surely installed: all of them unless there is an error, and then those
// of the batches before the failed one (of which some may be installed).
func (d *Dataplane) PutTables(ctx context.Context, tables []TableContent) (int, error) {
	for _, t := range tables {
		if t.ID == 0 {
			return 0, errors.New("table id 0 is reserved")
		}
		if t.Size <= 0 {
			return 0, fmt.Errorf("table %d: empty table (use table id 0 for no backends)", t.ID)
		}
	}
	workers := runtime.GOMAXPROCS(0)
	inners := make([]*ebpf.Map, min(len(tables), tablesPerBatch))
	keys := make([]uint32, 0, len(inners))
	fds := make([]uint32, 0, len(inners))
	done := 0
	for start := 0; start < len(tables); start += tablesPerBatch {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		chunk := tables[start:min(start+tablesPerBatch, len(tables))]
		err := createTables(chunk, inners[:len(chunk)], workers)
		if err == nil {
			keys, fds = keys[:0], fds[:0]
			for i, t := range chunk {
				keys = append(keys, t.ID)
				fds = append(fds, uint32(inners[i].FD()))
			}
			// On error the count is not to be trusted (the kernel may fail
			// before it writes it), so a failed batch counts as none.
			if _, err = d.m.MaglevTables.BatchUpdate(keys, fds, nil); err != nil {
				err = fmt.Errorf("swap in %d tables: %w", len(keys), err)
			} else {
				done += len(chunk)
			}
		}
		for i, m := range inners[:len(chunk)] {
			if m != nil {
				m.Close()
				inners[i] = nil
			}
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// tableBytes is the length of the mapping of a table of size slots:
// slot 0 holds the size, and elements are 8 bytes apart (array values
// are 8-byte aligned).
func tableBytes(size int) uintptr {
	page := uintptr(os.Getpagesize())
	return (uintptr(size+1)*8 + page - 1) / page * page
}

// createTables creates and fills an inner map per table, on up to workers
// goroutines. The maps created are left in inners, also on error, for the
// caller to close.
func createTables(tables []TableContent, inners []*ebpf.Map, workers int) error {
	offsets := make([]uintptr, len(tables)+1)
	largest := 0
	for i, t := range tables {
		offsets[i+1] = offsets[i] + tableBytes(t.Size)
		largest = max(largest, t.Size)
	}
	// Reserve the address range; each table's mapping replaces its part.
	window, err := unix.MmapPtr(-1, 0, nil, offsets[len(tables)], unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return fmt.Errorf("reserve address space for %d tables: %w", len(tables), err)
	}
	// A failed MAP_FIXED mmap may already have unmapped its part of the
	// reservation (older kernels do), and the Go runtime may have mapped
	// something there since: unmap around such holes, never across them.
	holes := make([]bool, len(tables))
	defer func() {
		start := 0
		for i := 0; i <= len(tables); i++ {
			if i < len(tables) && !holes[i] {
				continue
			}
			if offsets[i] > offsets[start] {
				unix.MunmapPtr(unsafe.Add(window, offsets[start]), offsets[i]-offsets[start])
			}
			start = i + 1
		}
	}()

	var next atomic.Int64
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]uint32, largest)
			for {
				i := int(next.Add(1) - 1)
				if i >= len(tables) || errs[w] != nil {
					return
				}
				inners[i], errs[w] = newTable(tables[i], unsafe.Add(window, offsets[i]), buf)
				holes[i] = errors.Is(errs[w], errMapping)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// errMapping marks a failed mapping of a new table into its window.
var errMapping = errors.New("map into memory")

// newTable creates an inner map holding t, filled through a mapping at
// addr, which stays until the caller unmaps it; buf (at least t.Size
// long) takes the slots first.
func newTable(t TableContent, addr unsafe.Pointer, buf []uint32) (*ebpf.Map, error) {
	slots := buf[:t.Size]
	if err := t.Fill(slots); err != nil {
		return nil, fmt.Errorf("table %d: %w", t.ID, err)
	}
	inner, err := ebpf.NewMap(&ebpf.MapSpec{
		Name:       "maglev_table",
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  4,
		MaxEntries: uint32(t.Size) + 1,
		// Must match the outer map's template: tables of any size,
		// filled through a memory mapping.
		Flags: unix.BPF_F_INNER_MAP | unix.BPF_F_MMAPABLE,
	})
	if err != nil {
		return nil, fmt.Errorf("table %d: create: %w", t.ID, err)
	}
	length := tableBytes(t.Size)
	p, err := unix.MmapPtr(inner.FD(), 0, addr, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		inner.Close()
		return nil, fmt.Errorf("table %d: %w: %w", t.ID, errMapping, err)
	}
	const stride = 8
	mem := unsafe.Slice((*byte)(p), length)
	binary.NativeEndian.PutUint32(mem[0:], uint32(t.Size))
	for i, s := range slots {
		binary.NativeEndian.PutUint32(mem[(i+1)*stride:], s)
	}
	return inner, nil
}

// DeleteTable removes table id; a missing one is not an error.
func (d *Dataplane) DeleteTable(id uint32) error {
	if err := d.m.MaglevTables.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete table %d: %w", id, err)
	}
	return nil
}

// Table reads table id back: its slots (backend ids).
func (d *Dataplane) Table(id uint32) ([]uint32, error) {
	var innerID uint32
	if err := d.m.MaglevTables.Lookup(id, &innerID); err != nil {
		return nil, fmt.Errorf("table %d: %w", id, err)
	}
	inner, err := ebpf.NewMapFromID(ebpf.MapID(innerID))
	if err != nil {
		return nil, fmt.Errorf("table %d: open inner map: %w", id, err)
	}
	defer inner.Close()
	var size uint32
	if err := inner.Lookup(uint32(0), &size); err != nil {
		return nil, fmt.Errorf("table %d: read size: %w", id, err)
	}
	if size+1 > inner.MaxEntries() {
		return nil, fmt.Errorf("table %d: size %d does not fit its map of %d", id, size, inner.MaxEntries())
	}
	out := make([]uint32, size)
	var k, v uint32
	it := inner.Iterate()
	for it.Next(&k, &v) {
		if k >= 1 && k <= size {
			out[k-1] = v
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("table %d: read: %w", id, err)
	}
	return out, nil
}

// TableIDs lists the installed tables.
func (d *Dataplane) TableIDs() ([]uint32, error) {
	var ids []uint32
	err := d.eachTable(func(id, _ uint32) { ids = append(ids, id) })
	return ids, err
}

// eachTable calls fn with the id and inner map id of every installed
// table. The array of maps is read in batches (eachEntry), which skip its
// empty slots since Linux 6.14: one lookup per slot costs a system call
// for each of the 2 × --services-max ids. Before 6.14 a batch stops at the
// first empty slot, and id 0 is never used, so the first batch fails
// without an entry: the slots are then read one at a time.
func (d *Dataplane) eachTable(fn func(id, innerID uint32)) error {
	seen := false
	err := eachEntry(d.m.MaglevTables, func(id, innerID uint32) bool {
		seen = true
		fn(id, innerID)
		return true
	})
	if err != nil && !seen {
		return d.eachTableByLookups(fn)
	}
	if err != nil {
		return fmt.Errorf("read tables: %w", err)
	}
	return nil
}

func (d *Dataplane) eachTableByLookups(fn func(id, innerID uint32)) error {
	var id, innerID uint32
	it := d.m.MaglevTables.Iterate()
	for it.Next(&id, &innerID) {
		fn(id, innerID)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read tables: %w", err)
	}
	return nil
}
