package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// Detach removes everything xdplb attached or pinned under pinRoot: links
// (which detaches the programs), clsact filters, and the pinned maps.
// Programs of other tools are not touched. It is safe to call when nothing
// is attached.
func Detach(pinRoot string) error {
	var errs []error
	entries, err := os.ReadDir(linksDir(pinRoot))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s: %w", linksDir(pinRoot), err)
	}
	for _, e := range entries {
		path := filepath.Join(linksDir(pinRoot), e.Name())
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("open %s: %w", path, err))
			os.Remove(path)
			continue
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", path, err))
		}
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", path, err))
		}
	}
	// clsact fallback filters are not links; find them by name.
	if links, err := netlink.LinkList(); err == nil {
		for _, dev := range links {
			if err := detachClsact(dev.Attrs().Index); err != nil {
				errs = append(errs, fmt.Errorf("interface %s: remove TC filter: %w", dev.Attrs().Name, err))
			}
		}
	}
	if err := os.RemoveAll(Dir(pinRoot)); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", Dir(pinRoot), err))
	}
	// Remove the parent if no other version is pinned.
	parent := filepath.Dir(Dir(pinRoot))
	if rest, err := os.ReadDir(parent); err == nil && len(rest) == 0 && strings.HasSuffix(parent, "xdplb") {
		os.Remove(parent)
	}
	return errors.Join(errs...)
}

// CheckPinned fails when nothing of xdplb's is pinned under pinRoot.
func CheckPinned(pinRoot string) error {
	if _, err := os.Stat(Dir(pinRoot)); errors.Is(err, os.ErrNotExist) {
		return nothingPinned(pinRoot)
	}
	return nil
}

// OtherSchemaVersions lists the pin directories under pinRoot of schema
// versions other than this build's (see SchemaVersion): pins of an xdplb
// of another version, which this one neither reads nor removes.
func OtherSchemaVersions(pinRoot string) []string {
	entries, err := os.ReadDir(filepath.Dir(Dir(pinRoot)))
	if err != nil {
		return nil
	}
	var others []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != SchemaVersion {
			others = append(others, e.Name())
		}
	}
	return others
}

func nothingPinned(pinRoot string) error {
	return fmt.Errorf("no xdplb datapath pinned under %s (is the agent running with this --bpffs-root?)", pinRoot)
}

// OpenPinned opens the pinned maps for reading and writing without loading
// any program: for introspection, while an agent runs or after it stopped.
func OpenPinned(pinRoot string) (*Maps, error) {
	m := &Maps{}
	for name, handle := range m.byName() {
		path := filepath.Join(mapsDir(pinRoot), name)
		mp, err := loadPinnedMap(path)
		if errors.Is(err, os.ErrNotExist) && optionalMaps[name] {
			continue
		}
		if err != nil {
			m.Close()
			if errors.Is(err, os.ErrNotExist) {
				return nil, nothingPinned(pinRoot)
			}
			return nil, explainBPFError("open "+path, err)
		}
		*handle = mp
	}
	return m, nil
}
