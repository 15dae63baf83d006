package loadertest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xdplb/xdplb/loader"
)

// LinkPrograms returns the program each link pinned under pinRoot runs,
// by pin name.
func LinkPrograms(t testing.TB, pinRoot string) map[string]ebpf.ProgramID {
	t.Helper()
	dir := filepath.Join(loader.Dir(pinRoot), "links")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	progs := map[string]ebpf.ProgramID{}
	for _, e := range entries {
		l, err := link.LoadPinnedLink(filepath.Join(dir, e.Name()), nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		progs[e.Name()] = info.Program
	}
	return progs
}

// PinnedMapIDs returns the id of every map pinned under pinRoot, by name,
// but the route cache, which every load starts afresh.
func PinnedMapIDs(t testing.TB, pinRoot string) map[string]ebpf.MapID {
	t.Helper()
	dir := filepath.Join(loader.Dir(pinRoot), "maps")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]ebpf.MapID{}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "new_flow_routes" {
			continue
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, e.Name()), nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		ids[e.Name()], _ = info.ID()
	}
	return ids
}
