package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/tests/testenv"
)

// A detach under a root with nothing pinned (a typo, or a second cleanup)
// says so, succeeds and touches nothing: in particular not the clsact
// filters of an agent on another root, which carry the same names.
func TestDetachWithNothingPinnedTouchesNothing(t *testing.T) {
	cleanEnv(t)
	ns := testNetns(t)
	prog := testenv.PassingTCProgram(t)
	// What the clsact fallback of an agent on another root attaches.
	filters := func() (int, error) {
		dev, err := netlink.LinkByName(testIface)
		if err != nil {
			return 0, err
		}
		list, err := netlink.FilterList(dev, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			return 0, err
		}
		n := 0
		for _, f := range list {
			if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == "xdplb_nic_ingress" {
				n++
			}
		}
		return n, nil
	}
	err := ns.Do(func() error {
		dev, err := netlink.LinkByName(testIface)
		if err != nil {
			return err
		}
		qdisc := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index,
			Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
		if err := netlink.QdiscAdd(qdisc); err != nil {
			return err
		}
		return netlink.FilterAdd(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: dev.Attrs().Index,
			Parent: netlink.HANDLE_MIN_INGRESS, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1},
			Fd: prog.FD(), Name: "xdplb_nic_ingress", DirectAction: true})
	})
	if err != nil {
		t.Fatal(err)
	}

	root := filepath.Join(t.TempDir(), "typo")
	r := runIn(t, ns, "detach", "--bpffs-root", root)
	if want := "nothing pinned under " + root + ": nothing to detach\n"; r.code != exitOK || r.stdout != want || r.stderr != "" {
		t.Errorf("detach with nothing pinned: exit %d, stdout %q, stderr %q; want 0 and %q", r.code, r.stdout, r.stderr, want)
	}
	var left int
	if err := ns.Do(func() (err error) { left, err = filters(); return err }); err != nil {
		t.Fatal(err)
	}
	if left != 1 {
		t.Errorf("%d xdplb clsact filters left on %s, want the other root's 1", left, testIface)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("%s was created (%v)", root, err)
	}
}

// Pins of another schema version (an xdplb of another version pinned
// them) are not this version's to remove, nor are they nothing: detach
// fails and names them.
func TestDetachNamesPinsOfAnotherVersion(t *testing.T) {
	cleanEnv(t)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "xdplb", "v0", "maps"), 0o700); err != nil {
		t.Fatal(err)
	}
	r := runIn(t, nil, "detach", "--bpffs-root", root)
	want := "xdplb: nothing pinned under " + root + " by this version (schema v1), but pins of schema v0 are: " +
		"detach them with the xdplb that pinned them\n"
	if r.code != exitFailure || r.stderr != want {
		t.Errorf("detach with another version's pins: exit %d, stderr %q; want 1 and %q", r.code, r.stderr, want)
	}
	if _, err := os.Stat(filepath.Join(root, "xdplb", "v0", "maps")); err != nil {
		t.Errorf("the other version's pins: %v", err)
	}
}
