package xdp

import "github.com/cilium/ebpf"

// DatapathObjects returns the loaders of the embedded objects whose
// programs the agent attaches, in the order they are listed to users:
// XDP on the NIC, TC ingress on the NIC, TC ingress on pod interfaces, TC
// egress (host replies), the cgroup socket programs.
func DatapathObjects() []func() (*ebpf.CollectionSpec, error) {
	return []func() (*ebpf.CollectionSpec, error){LoadNic, LoadNicIngress, LoadPod, LoadHostReply, LoadSock}
}
