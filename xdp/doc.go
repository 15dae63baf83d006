// Package xdp holds xdplb's BPF programs (C sources in this directory, one
// program per hook, built from the shared headers in include/, one concern
// each) and their generated Go bindings.
//
// The datapath:
//   - xdp_nic.c: XDP on the node's NIC, the north-south fast path.
//   - tc_nic.c: TC ingress on the NIC, finishing what XDP hands over and
//     doing everything with --xdp-mode off.
//   - tc_pod.c: TC ingress on every pod interface: pods reaching services,
//     replies of local backends.
//   - tc_host.c: TC egress on the NIC and pod interfaces: replies of
//     backends at the node's own address, the node's ICMP errors about
//     translated flows.
//   - sock.c: cgroup socket hooks for the node's own processes.
//
// Benchmarks and the perf suite have programs of their own, in package
// baseline (xdp/baseline): references to measure against, restoring
// wrappers, and the perf generator, sinks and forwarder.
//
// include/structs.h is the schema of all shared state (include/maps.h the
// maps themselves); the Go types in this package (FrontendKey, CtEntry,
// ...) are generated from it (schema.go). This package also carries the Go
// side of the datapath's conventions, such as FlowHash and the names of the
// counters.
package xdp
