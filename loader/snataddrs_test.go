package loader_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// An attached interface records as its extra SNAT addresses those of
// SNATExtraAddrs it has, besides its first address; one it gets later is
// recorded when the agent refreshes the interface.
func TestInterfaceRecordsItsExtraSNATAddresses(t *testing.T) {
	ns := testenv.NewNetns(t, "snata")
	peer := testenv.NewNetns(t, "snatp")
	testenv.Veth(t, ns, "x0", peer, "x1")
	ns.IP("addr", "add", "192.0.2.1/24", "dev", "x0")
	ns.IP("addr", "add", "192.0.2.7/24", "dev", "x0")
	root := testenv.BPFFS(t)
	opts := smallOptions(root)
	opts.SNATExtraAddrs[0] = netip.MustParseAddr("192.0.2.7")
	opts.SNATExtraAddrs[1] = netip.MustParseAddr("192.0.2.8")    // added later
	opts.SNATExtraAddrs[2] = netip.MustParseAddr("192.0.2.1")    // the first address: not extra
	opts.SNATExtraAddrs[3] = netip.MustParseAddr("198.51.100.9") // on no interface
	recorded := func(dp *loader.Datapath) ([]netip.Addr, error) {
		var idx uint32
		var iface xdp.Iface
		var out []netip.Addr
		it := dp.Maps.Ifaces.Iterate()
		for it.Next(&idx, &iface) {
			if xdp.NetToAddr(iface.Addr) != netip.MustParseAddr("192.0.2.1") {
				return nil, fmt.Errorf("interface %d recorded with address %s", idx, xdp.NetToAddr(iface.Addr))
			}
			for _, a := range iface.ExtraAddrs[:iface.ExtraCount] {
				out = append(out, xdp.NetToAddr(a))
			}
		}
		return out, it.Err()
	}
	err := ns.Do(func() error {
		dp, err := loadertest.Load(opts, nil)
		if err != nil {
			return err
		}
		defer dp.Close()
		if _, err := dp.AttachNIC("x0", loader.XDPNative); err != nil {
			return err
		}
		got, err := recorded(dp)
		if err != nil {
			return err
		}
		if want := []netip.Addr{netip.MustParseAddr("192.0.2.7")}; !slices.Equal(got, want) {
			t.Errorf("extra SNAT addresses %v, want %v", got, want)
		}
		ns.IP("addr", "add", "192.0.2.8/24", "dev", "x0")
		if err := dp.RefreshInterface("x0"); err != nil {
			return err
		}
		got, err = recorded(dp)
		if err != nil {
			return err
		}
		if want := []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("192.0.2.8")}; !slices.Equal(got, want) {
			t.Errorf("after the address was added: extra SNAT addresses %v, want %v", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
