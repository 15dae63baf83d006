package xdp

// The BPF objects and their Go bindings are generated from the C sources in
// this directory and committed, so building xdplb needs no clang. After
// changing a .c or .h file run `make generate`.

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc ${BPF_CLANG} -strip ${BPF_STRIP} -cflags ${BPF_CFLAGS} -target bpfel -go-package xdp -type datapath_config -type iface -type frontend_key -type frontend -type frontend_flags -type backend -type backend_flags -type source_range_key -type ct_key -type ct_entry -type ct_tcp_state -type ct_flags -type nat_key -type nat_entry -type snat_slot -type snat_slot_flags -type snat_bucket_hand -type snat_hints -type affinity_key -type affinity_entry -type stat -type counter -type svc_counter -type svc_name -type agent_state -type route_reuse_lease -type synproxy_seq -type syn_flood -type syn_cookie_mode Nic xdp_nic.c
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc ${BPF_CLANG} -strip ${BPF_STRIP} -cflags ${BPF_CFLAGS} -target bpfel -go-package xdp -no-global-types NicIngress tc_nic.c
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc ${BPF_CLANG} -strip ${BPF_STRIP} -cflags ${BPF_CFLAGS} -target bpfel -go-package xdp -no-global-types Pod tc_pod.c
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc ${BPF_CLANG} -strip ${BPF_STRIP} -cflags ${BPF_CFLAGS} -target bpfel -go-package xdp -no-global-types HostReply tc_host.c
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc ${BPF_CLANG} -strip ${BPF_STRIP} -cflags ${BPF_CFLAGS} -target bpfel -go-package xdp -no-global-types Sock sock.c
