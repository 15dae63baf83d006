// Package xdp holds xdplb's BPF programs (C sources in this directory, one
// program per hook, built from the shared headers in include/) and their
// generated Go bindings.
//
//   - xdp_nic.c: XDP on the node's NIC, the north-south fast path.
//   - tc_nic.c: TC ingress on the NIC, finishing what XDP hands over.
//   - baseline.c: reference programs for benchmarks and the perf suite.
//
// include/maps.h is the schema of all shared state; the Go types in this
// package (FrontendKey, CtEntry, ...) are generated from it. This
// package also carries the Go side of the datapath's conventions, such as
// FlowHash and the names of the counters.
package xdp
