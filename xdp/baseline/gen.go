// Package baseline holds the BPF programs that benchmarks and the perf
// suite measure xdplb against, and the perf suite's generator, sinks and
// forwarder: nothing of the datapath. xdp.c has the XDP programs, tc.c the
// TC ones; their comments list each.
package baseline

// The objects and their Go bindings are generated and committed, like the
// datapath's (see xdp/gen.go): run `make generate` after changing a .c file.

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc ${BPF_CLANG} -strip ${BPF_STRIP} -cflags ${BPF_CFLAGS} -target bpfel -go-package baseline -type frame_template -type sink_counter -type sink_pass -type fwd_port -type gen_config -type gen_tuple -type gen_state XDP xdp.c
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc ${BPF_CLANG} -strip ${BPF_STRIP} -cflags ${BPF_CFLAGS} -target bpfel -go-package baseline -type tc_frame_template TC tc.c
