package loader

import (
	"path/filepath"
	"testing"
)

func TestLinkPinNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		pin  LinkPin
	}{
		{"xdp-native-eth0", LinkPin{Hook: HookXDP, Mode: "native", Ifname: "eth0"}},
		{"xdp-generic-eth0:100", LinkPin{Hook: HookXDP, Mode: "generic", Ifname: "eth0.100"}},
		{"tc-ingress-eth0", LinkPin{Hook: HookTCIngress, Mode: "tcx", Ifname: "eth0"}},
		{"tc-egress-bond0:42", LinkPin{Hook: HookTCEgress, Mode: "tcx", Ifname: "bond0.42"}},
		{"tc-pod-veth1", LinkPin{Hook: HookTCPod, Mode: "tcx", Ifname: "veth1"}},
		{"tc-podreply-veth1", LinkPin{Hook: HookTCPodReply, Mode: "tcx", Ifname: "veth1"}},
		{"cgroup-connect4", LinkPin{Hook: HookCgroup, Mode: "connect4"}},
	} {
		got, ok := ParseLinkPin(tc.name)
		if !ok || got != tc.pin {
			t.Errorf("ParseLinkPin(%q) = %+v, %v; want %+v", tc.name, got, ok, tc.pin)
		}
		if name := tc.pin.Name(); name != tc.name {
			t.Errorf("%+v.Name() = %q, want %q", tc.pin, name, tc.name)
		}
	}
	for _, name := range []string{"xdp-turbo-eth0", "renaming-xdp-native-eth0", "maps", "tc-eth0", ""} {
		if pin, ok := ParseLinkPin(name); ok {
			t.Errorf("ParseLinkPin(%q) = %+v, want not a link pin", name, pin)
		}
	}
}

// TestLinkPathsAreLinkPins checks that every pinned link's path is one
// ParseLinkPin reads back, hook and interface.
func TestLinkPathsAreLinkPins(t *testing.T) {
	for _, tc := range []struct {
		path string
		hook string
	}{
		{xdpLinkPath("/r", XDPNative, "eth0.7"), HookXDP},
		{xdpLinkPath("/r", XDPGeneric, "eth0.7"), HookXDP},
		{tcLinkPath("/r", "eth0.7"), HookTCIngress},
		{tcEgressLinkPath("/r", "eth0.7"), HookTCEgress},
		{podLinkPath("/r", "eth0.7"), HookTCPod},
		{podReplyLinkPath("/r", "eth0.7"), HookTCPodReply},
	} {
		if filepath.Dir(tc.path) != linksDir("/r") {
			t.Errorf("%s is not in %s", tc.path, linksDir("/r"))
		}
		pin, ok := ParseLinkPin(filepath.Base(tc.path))
		if !ok || pin.Hook != tc.hook || pin.Ifname != "eth0.7" {
			t.Errorf("%s reads as %+v, %v; want hook %s on eth0.7", tc.path, pin, ok, tc.hook)
		}
	}
}
