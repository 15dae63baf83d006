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
