package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/xdp"
)

// ensureBPFFS makes sure root is on a bpffs, mounting one there if not.
func ensureBPFFS(root string) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("bpffs root %s: %w", root, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return fmt.Errorf("bpffs root %s: %w", root, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w (needs CAP_SYS_ADMIN, or mount it beforehand)", root, err)
	}
	return nil
}

// migrations copy live flow state into a resized map. Maps without one
// start empty and are refilled by the control plane from the desired state.
func migrations(opts Options) map[string]func(from, to *ebpf.Map) (copied, skipped int) {
	return map[string]func(from, to *ebpf.Map) (int, int){
		"conntrack":  copyEntries,
		"nat":        copyEntries,
		"affinity":   copyEntries,
		"snat_slots": func(from, to *ebpf.Map) (int, int) { return copySNATSlots(from, to, opts) },
	}
}

// adoptPinnedMaps checks every pinned map against the spec. A compatible
// map is left for the collection loader to adopt. An incompatible one (a
// size flag changed) is replaced: flow state is copied into a new map,
// other maps start empty and are refilled by the control plane.
func adoptPinnedMaps(spec *ebpf.CollectionSpec, dir string, opts Options, log *slog.Logger) error {
	migrate := migrations(opts)
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		path := filepath.Join(dir, name)
		old, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open pinned map %s: %w", path, err)
		}
		incompatible := ms.Compatible(old)
		if incompatible == nil {
			old.Close()
			continue
		}
		err = replacePinnedMap(name, ms, old, path, migrate[name], log, incompatible)
		old.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// retiredMaps are maps earlier versions pinned that this one no longer has.
func retiredMaps() []string {
	return []string{
		"snat_hands", // per-bucket SNAT hands, now snat_bucket_hands and snat_backend_hands
	}
}

// unpinRetiredMaps removes the pins of retiredMaps(), once this version has
// loaded, so they do not hold kernel memory until the next detach. A pin
// that is not a map is left alone; failures are logged, not fatal.
func unpinRetiredMaps(dir string, log *slog.Logger) {
	for _, name := range retiredMaps() {
		path := filepath.Join(dir, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			log.Warn("a retired map's pin could not be opened; left in place", "path", path, "err", err)
			continue
		}
		m.Close()
		if err := os.Remove(path); err != nil {
			log.Warn("could not unpin a retired map", "path", path, "err", err)
			continue
		}
		log.Info("unpinned a map this version no longer uses", "map", name)
	}
}

func replacePinnedMap(name string, ms *ebpf.MapSpec, old *ebpf.Map, path string,
	migrate func(from, to *ebpf.Map) (int, int), log *slog.Logger, why error) error {
	spec := ms.Copy()
	spec.Pinning = ebpf.PinNone // pinned below, in place of the old one
	fresh, err := ebpf.NewMap(spec)
	if err != nil {
		return fmt.Errorf("recreate map %s: %w", name, err)
	}
	defer fresh.Close()

	copied, skipped := 0, 0
	if migrate != nil {
		copied, skipped = migrate(old, fresh)
	}
	if err := old.Unpin(); err != nil {
		return fmt.Errorf("unpin old map %s: %w", name, err)
	}
	if err := fresh.Pin(path); err != nil {
		return fmt.Errorf("pin new map %s: %w", name, err)
	}
	log.Warn("pinned map replaced", "map", name, "reason", why.Error(),
		"entries_copied", copied, "entries_not_copied", skipped)
	return nil
}

// copyEntries copies what fits from one hash map into another.
func copyEntries(from, to *ebpf.Map) (copied, skipped int) {
	key := make([]byte, from.KeySize())
	value := make([]byte, from.ValueSize())
	iter := from.Iterate()
	for iter.Next(&key, &value) {
		if err := to.Put(key, value); err != nil {
			skipped++
			continue
		}
		copied++
	}
	return copied, skipped
}

// copySNATSlots moves the claimed SNAT slots of an array laid out for other
// options (SNAT range, NAT size) to where opts place them. A flow whose
// port is outside the new range, or whose new slot is taken, is skipped:
// its forward half claims a new port on its next packet.
func copySNATSlots(from, to *ebpf.Map, opts Options) (copied, skipped int) {
	var index uint32
	var slot xdp.NicSnatSlot
	iter := from.Iterate()
	for iter.Next(&index, &slot) {
		if slot.Key.Proto == 0 {
			continue
		}
		port := xdp.NetToPort(slot.Key.Dport)
		if port < opts.SNATPortMin || port > opts.SNATPortMax {
			skipped++
			continue
		}
		backend := netip.AddrPortFrom(xdp.NetToAddr(slot.Key.Saddr), xdp.NetToPort(slot.Key.Sport))
		at := xdp.SNATSlot(backend, xdp.NetToAddr(slot.Key.Daddr), port, slot.Key.Proto,
			opts.SNATPortMin, opts.SNATPortMax, opts.SNATBuckets())
		var there xdp.NicSnatSlot
		if err := to.Lookup(at, &there); err != nil || there.Key.Proto != 0 {
			skipped++
			continue
		}
		// A claim under way in the running datapath may have it
		// locked; the copy starts unlocked.
		slot.Generation &^= xdp.SNATSlotLocked
		if err := to.Put(at, slot); err != nil {
			skipped++
			continue
		}
		copied++
	}
	return copied, skipped
}

func loadPinnedMap(path string) (*ebpf.Map, error) {
	return ebpf.LoadPinnedMap(path, nil)
}
