package loader_test

import (
	"testing"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/testenv"
)

func TestRxVLANOffloadFollowsEthtool(t *testing.T) {
	testenv.RequirePrivileged(t)
	testenv.RequireCommand(t, "ethtool")
	ns := testenv.NewNetns(t, "vl")
	peer := testenv.NewNetns(t, "vlp")
	testenv.Veth(t, ns, "x0", peer, "x1")
	for _, on := range []bool{false, true, false} {
		setting := map[bool]string{false: "off", true: "on"}[on]
		ns.Exec("ethtool", "-K", "x0", "rxvlan", setting)
		if err := ns.Do(func() error {
			got, err := loader.RxVLANOffload("x0")
			if err != nil {
				return err
			}
			if got != on {
				t.Errorf("rx-vlan-offload %s: RxVLANOffload says %v", setting, got)
			}
			// No VLAN device on x0: none hidden, whatever the offload.
			if vlans, err := loader.HiddenVLANs("x0"); err != nil || vlans != nil {
				t.Errorf("rx-vlan-offload %s, no VLAN device: HiddenVLANs = %v, %v; want none", setting, vlans, err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ns.Do(func() error {
		if _, err := loader.RxVLANOffload("nosuch0"); err == nil {
			t.Error("RxVLANOffload of a missing interface: no error")
		}
		if _, err := loader.HiddenVLANs("nosuch0"); err == nil {
			t.Error("HiddenVLANs of a missing interface: no error")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
