package dataplane_test

import (
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
)

// loadSmall loads a datapath with small maps on a private bpffs; size
// changes the sizes a test cares about. It returns the loaded datapath
// (for raw map access) and its Dataplane.
func loadSmall(t testing.TB, size func(*loader.Options)) (*loader.Datapath, *dataplane.Dataplane) {
	t.Helper()
	testenv.RequirePrivileged(t)
	opts := loadertest.SmallOptions(testenv.BPFFS(t))
	if size != nil {
		size(&opts)
	}
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	return dp, dataplane.New(&dp.Maps)
}
