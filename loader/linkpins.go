package loader

import (
	"strings"
)

// Hooks a pinned link attaches a program to.
const (
	HookXDP        = "xdp"         // a NIC's XDP program
	HookTCIngress  = "tc-ingress"  // a NIC's TC ingress program
	HookTCEgress   = "tc-egress"   // a NIC's TC egress program
	HookTCPod      = "tc-pod"      // a pod interface's TC ingress program
	HookTCPodReply = "tc-podreply" // a pod interface's TC egress program
	HookCgroup     = "cgroup"      // a socket program on the cgroup
)

// tcxMode is the Mode of the TC hooks' pinned links: only tcx links are
// pinned (clsact filters are not links).
const tcxMode = "tcx"

// LinkPin is what the name of a pinned link in linksDir says: the hook,
// its mode (XDP's native or generic, tcx for TC, the socket hook such as
// connect4 for cgroup) and the interface (none for cgroup links).
type LinkPin struct {
	Hook   string
	Mode   string
	Ifname string
}

// Name is the pin's file name: "xdp-<mode>-<if>", "<hook>-<if>" for TC
// hooks, "cgroup-<mode>" (the interface as PinIfname writes it).
func (p LinkPin) Name() string {
	switch p.Hook {
	case HookXDP:
		return HookXDP + "-" + p.Mode + "-" + PinIfname(p.Ifname)
	case HookCgroup:
		return HookCgroup + "-" + p.Mode
	}
	return p.Hook + "-" + PinIfname(p.Ifname)
}

// ParseLinkPin reads the name of a pinned link; false for a name that is
// not one.
func ParseLinkPin(name string) (LinkPin, bool) {
	for _, mode := range []XDPMode{XDPNative, XDPGeneric} {
		if pinned, ok := strings.CutPrefix(name, HookXDP+"-"+string(mode)+"-"); ok {
			return LinkPin{Hook: HookXDP, Mode: string(mode), Ifname: IfnameOfPin(pinned)}, true
		}
	}
	for _, hook := range []string{HookTCIngress, HookTCEgress, HookTCPodReply, HookTCPod} {
		if pinned, ok := strings.CutPrefix(name, hook+"-"); ok {
			return LinkPin{Hook: hook, Mode: tcxMode, Ifname: IfnameOfPin(pinned)}, true
		}
	}
	if attach, ok := strings.CutPrefix(name, HookCgroup+"-"); ok {
		return LinkPin{Hook: HookCgroup, Mode: attach}, true
	}
	return LinkPin{}, false
}
