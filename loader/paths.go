// Where everything is pinned under --bpffs-root, in one place:
//
//	<root>/xdplb/                         the agents' lock (pinLockPath)
//	<root>/xdplb/<SchemaVersion>/         Dir: one tree per schema version
//	    maps/<map>                        every pinned map, by name (mapsDir)
//	    maps-replacing/                   a commit's staging (stagingDir)
//	    links/<hook>-<if>                 every pinned link (linksDir, LinkPin):
//	                                      xdp-<mode>-<if>, tc-ingress-<if>,
//	                                      tc-egress-<if>, tc-pod-<if>,
//	                                      tc-podreply-<if>, cgroup-<hook>
//	    clsact-pods/<if>                  pod interfaces attached through
//	                                      clsact, which have no link
//	                                      (clsactPodsDir)
//
// Interface names in pins have each '.' as ':' (PinIfname).

package loader

import (
	"path/filepath"
	"strings"
)

// Dir returns the versioned pin directory (<root>/xdplb/<version>).
func Dir(pinRoot string) string {
	return filepath.Join(pinRoot, "xdplb", SchemaVersion)
}

func mapsDir(pinRoot string) string  { return filepath.Join(Dir(pinRoot), "maps") }
func linksDir(pinRoot string) string { return filepath.Join(Dir(pinRoot), "links") }

// PinIfname returns ifname as the names of link pins carry it. The pin of
// a link on an interface is named after it (<hook>-<ifname>). bpffs
// refuses names with a '.', which interface names may have (VLAN
// interfaces: eth0.100, bond0.42), and no interface name has a ':' (see
// dev_valid_name in the kernel): in a pin's name, each '.' is a ':'. The
// pins of names without a '.' are named as before, so a new version
// adopts those an earlier one pinned.
func PinIfname(ifname string) string { return strings.ReplaceAll(ifname, ".", ":") }

// IfnameOfPin returns the interface name that a link pin's name carries
// as pinned (undoing PinIfname).
func IfnameOfPin(pinned string) string { return strings.ReplaceAll(pinned, ":", ".") }

// pinLockPath is what an agent locks (flock) for the pins under pinRoot.
func pinLockPath(pinRoot string) string { return filepath.Join(pinRoot, "xdplb") }

// A pod interface attached through clsact (kernels without tcx) has no
// pinned link: an empty directory named after it in clsactPodsDir marks
// it instead, for PodInterfaces to find it. (Not in linksDir, where every
// entry is a link.)
func clsactPodsDir(pinRoot string) string { return filepath.Join(Dir(pinRoot), "clsact-pods") }

func clsactPodMark(pinRoot, ifname string) string {
	return filepath.Join(clsactPodsDir(pinRoot), PinIfname(ifname))
}

// stagingDir is where a commit pins the replacements, and links the maps
// they replace, before moving them into place. It is not the maps'
// directory, whose names are the maps'; bpffs refuses names with dots.
func stagingDir(mapsDir string) string { return filepath.Join(filepath.Dir(mapsDir), "maps-replacing") }

func (p LinkPin) path(pinRoot string) string { return filepath.Join(linksDir(pinRoot), p.Name()) }

func xdpLinkPath(pinRoot string, mode XDPMode, ifname string) string {
	return LinkPin{Hook: HookXDP, Mode: string(mode), Ifname: ifname}.path(pinRoot)
}

func tcLinkPath(pinRoot, ifname string) string {
	return LinkPin{Hook: HookTCIngress, Mode: tcxMode, Ifname: ifname}.path(pinRoot)
}

func tcEgressLinkPath(pinRoot, ifname string) string {
	return LinkPin{Hook: HookTCEgress, Mode: tcxMode, Ifname: ifname}.path(pinRoot)
}
