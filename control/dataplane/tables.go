package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// PutTable installs a Maglev table (backend ids, one per slot) under id.
// The table is built in a new inner map and then swapped into the outer
// map in one update, so the datapath sees either the old table or the new
// one, never a mix.
func (d *Dataplane) PutTable(id uint32, slots []uint32) error {
	if id == 0 {
		return errors.New("table id 0 is reserved")
	}
	if len(slots) == 0 {
		return fmt.Errorf("table %d: empty table (use table id 0 for no backends)", id)
	}
	inner, err := ebpf.NewMap(&ebpf.MapSpec{
		Name:       "maglev_table",
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  4,
		MaxEntries: uint32(len(slots)) + 1,
		// Must match the outer map's template: tables of any size,
		// filled through a memory mapping.
		Flags: unix.BPF_F_INNER_MAP | unix.BPF_F_MMAPABLE,
	})
	if err != nil {
		return fmt.Errorf("table %d: create: %w", id, err)
	}
	defer inner.Close()
	if err := fillTable(inner, slots); err != nil {
		return fmt.Errorf("table %d: fill: %w", id, err)
	}
	if err := d.m.MaglevTables.Put(id, inner); err != nil {
		return fmt.Errorf("table %d: swap in: %w", id, err)
	}
	return nil
}

// fillTable writes slot 0 (the size) and the slots through a mapping of
// the array: elements are 8 bytes apart (array values are 8-byte aligned).
func fillTable(m *ebpf.Map, slots []uint32) error {
	const stride = 8
	size := (len(slots) + 1) * stride
	page := os.Getpagesize()
	buf, err := unix.Mmap(m.FD(), 0, (size+page-1)/page*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	binary.NativeEndian.PutUint32(buf[0:], uint32(len(slots)))
	for i, s := range slots {
		binary.NativeEndian.PutUint32(buf[(i+1)*stride:], s)
	}
	return unix.Munmap(buf)
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
	var k, v uint32
	it := d.m.MaglevTables.Iterate()
	for it.Next(&k, &v) {
		ids = append(ids, k)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read tables: %w", err)
	}
	return ids, nil
}
