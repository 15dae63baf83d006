package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
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

// migratable maps carry live flow state worth copying when they are resized.
// The others are rebuilt by the control plane from the desired state.
var migratable = map[string]bool{
	"conntrack": true,
	"nat":       true,
	"affinity":  true,
}

// adoptPinnedMaps checks every pinned map against the spec. A compatible
// map is left for the collection loader to adopt. An incompatible one (a
// size flag changed) is replaced: flow state is copied into a new map,
// other maps start empty and are refilled by the control plane.
func adoptPinnedMaps(spec *ebpf.CollectionSpec, dir string, log *slog.Logger) error {
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
		err = replacePinnedMap(name, ms, old, path, log, incompatible)
		old.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func replacePinnedMap(name string, ms *ebpf.MapSpec, old *ebpf.Map, path string,
	log *slog.Logger, why error) error {
	spec := ms.Copy()
	spec.Pinning = ebpf.PinNone // pinned below, in place of the old one
	fresh, err := ebpf.NewMap(spec)
	if err != nil {
		return fmt.Errorf("recreate map %s: %w", name, err)
	}
	defer fresh.Close()

	copied, skipped := 0, 0
	if migratable[name] {
		copied, skipped = copyEntries(old, fresh)
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

func loadPinnedMap(path string) (*ebpf.Map, error) {
	return ebpf.LoadPinnedMap(path, nil)
}
