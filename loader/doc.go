// Package loader puts xdplb's BPF programs into the kernel and keeps them
// there: it sizes and creates the maps (or adopts the ones pinned by an
// earlier agent, so established flows survive a restart or upgrade), loads
// the programs, attaches them through pinned bpf_links, replaces them in
// place with link.Update, and removes everything again on Detach.
//
// Everything lives under one versioned directory on bpffs:
//
//	<root>/xdplb/v1/maps/<map>          pinned maps
//	<root>/xdplb/v1/links/<hook>-<dev>  pinned links (xdp-native-eth0, tc-ingress-eth0,
//	                                    tc-egress-eth0, tc-pod-veth1, tc-podreply-veth1)
//	<root>/xdplb/v1/clsact-pods/<dev>   pod interfaces attached through clsact filters
//	                                    (kernels without tcx), which pin no link
//
// bpffs refuses names with a '.': the pins of an interface with one (a
// VLAN interface, eth0.100) carry it as a ':' (xdp-native-eth0:100; see
// PinIfname).
//
// The version changes when the layout of a map's key or value changes, so
// an agent never adopts maps it would misread.
package loader
