package loader_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
)

// A NIC that runs no XDP program (--xdp-mode off) and whose TC programs
// run as clsact filters (kernels without tcx) has no pinned link.
// NICAttached and DatapathAttached still find it, registered in the
// pinned maps: a failed start must not take it for one it attached
// afresh and detach it from under the running datapath.
func TestNICAttachedThroughClsactIsFound(t *testing.T) {
	ns := testenv.NewNetns(t, "cnic")
	peer := testenv.NewNetns(t, "cnicp")
	testenv.Veth(t, ns, "x0", peer, "x1")
	testenv.Veth(t, ns, "x2", peer, "x3")
	ns.IP("addr", "add", "192.0.2.1/24", "dev", "x0")
	root := testenv.BPFFS(t)
	err := ns.Do(func() error {
		if loader.DatapathAttached(root) {
			return errors.New("DatapathAttached before anything was loaded")
		}
		dp, err := loadertest.Load(loader.WithoutTCX(smallOptions(root)), nil)
		if err != nil {
			return err
		}
		defer dp.Close()
		if loader.DatapathAttached(root) || loader.NICAttached(root, "x0") {
			return errors.New("attached before AttachNIC")
		}
		att, err := dp.AttachNIC("x0", loader.XDPOff)
		if err != nil {
			return err
		}
		if att.TCMode != "clsact" {
			return fmt.Errorf("TC attached through %q, want clsact", att.TCMode)
		}
		if links, err := os.ReadDir(filepath.Join(loader.Dir(root), "links")); err == nil && len(links) > 0 {
			return fmt.Errorf("pinned links %v: the case needs a NIC without any", links)
		}
		if !loader.NICAttached(root, "x0") {
			t.Error("NICAttached(x0) = false for a NIC attached through clsact")
		}
		if loader.NICAttached(root, "x2") {
			t.Error("NICAttached(x2) = true for a device never attached")
		}
		if !loader.DatapathAttached(root) {
			t.Error("DatapathAttached = false with a NIC attached through clsact")
		}
		if err := dp.DetachNIC("x0"); err != nil {
			return err
		}
		if loader.NICAttached(root, "x0") || loader.DatapathAttached(root) {
			t.Errorf("after DetachNIC: NICAttached(x0) %v, DatapathAttached %v; want both false",
				loader.NICAttached(root, "x0"), loader.DatapathAttached(root))
		}
		// Nor is its address a SNAT source any more.
		var ifindex uint32
		var entry []byte
		if dp.Maps.Ifaces.Iterate().Next(&ifindex, &entry) {
			t.Errorf("after DetachNIC: interface %d still has a SNAT address", ifindex)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
