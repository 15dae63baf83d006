package xdp_test

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/xdp/baseline"
)

// BenchmarkTCDatapath measures the TC path of an established pod to
// ClusterIP flow against a TC program that does nothing, in the same run,
// restoring the input before every repetition like BenchmarkDatapath.
func BenchmarkTCDatapath(b *testing.B) {
	results := newBenchResults()
	f := newFixtureSized(b, 65536, 256)
	f.program(clusterService(packet.TCP, 80, backendRemote1, backendRemote2))
	var objs baseline.TCObjects
	if err := baseline.LoadTCObjects(&objs, nil); err != nil {
		b.Fatalf("load TC baselines: %v", err)
	}
	defer objs.Close()

	flow := tcpFrame(podAddr, 34567, clusterIP, 80, packet.ACK, "")
	flow.SrcMAC = localPodMAC
	frame := flow.Bytes()
	// Establish the flow: its handshake confirms it.
	syn := flow
	syn.Flags = packet.SYN
	v, out := f.runTC(f.dp.PodProgram(), syn.Bytes(), f.pod0)
	if v != tcActRedirect {
		b.Fatalf("SYN: verdict %d", int32(v))
	}
	synAck := replyTo(decode(b, out), packet.SYN|packet.ACK)
	synAck.SrcMAC = gwMAC
	if v, _ := f.runTC(f.dp.TCProgram(), synAck.Bytes(), f.nic1); v != tcActRedirect {
		b.Fatalf("SYN-ACK: verdict %d", int32(v))
	}
	if v, _ := f.runTC(f.dp.PodProgram(), frame, f.pod0); v != tcActRedirect {
		b.Fatalf("ACK: verdict %d", int32(v))
	}
	if fl, ok := f.flow(flowKeyOf(flow)); !ok || fl.Unconfirmed {
		b.Fatal("the pod's flow was not confirmed by its handshake")
	}
	restoring := func(target *ebpf.Program) *ebpf.Program {
		tmpl := baseline.TCTcFrameTemplate{Len: uint32(len(frame))}
		copy(tmpl.Data[:], frame)
		if err := objs.TcBenchTemplate.Put(uint32(0), tmpl); err != nil {
			b.Fatal(err)
		}
		if err := objs.TcBenchProgs.Put(uint32(0), target); err != nil {
			b.Fatalf("install tail-call target: %v", err)
		}
		return objs.TcRestore
	}
	run := func(name string, prog *ebpf.Program, overhead float64, want string) {
		b.Run(name, func(b *testing.B) {
			before := f.counters()
			d := f.benchTC(b, prog, frame, b.N)
			after := f.counters()
			if want != "" && after[want]-before[want] < uint64(b.N) {
				b.Fatalf("counter %s moved %d times in %d runs", want, after[want]-before[want], b.N)
			}
			ns := max(float64(d.Nanoseconds())-overhead, 0)
			b.ReportMetric(ns, "ns/pkt")
			b.ReportMetric(0, "ns/op")
			results.set(name, ns)
		})
	}
	run("baseline_tc_pass", objs.TcPass, 0, "")
	run("restore_overhead", restoring(objs.TcPass), 0, "")
	run("established_cluster_ip", restoring(f.dp.PodProgram()), results.ns["restore_overhead"], "tc_redirect")
	summary(b, results, []ratio{{"established_cluster_ip", "baseline_tc_pass", 0}})
}

// benchTC runs a TC program repeat times in the fixture namespace and
// returns the kernel's time per run.
func (f *fixture) benchTC(b *testing.B, prog *ebpf.Program, frame []byte, repeat int) time.Duration {
	b.Helper()
	var per time.Duration
	err := f.ns.Do(func() error {
		ctx := make([]byte, skbContextSize)
		binary.NativeEndian.PutUint32(ctx[skbIfindexOff:], uint32(f.pod0))
		opts := &ebpf.RunOptions{Data: frame, Context: ctx, Repeat: uint32(repeat)}
		start := time.Now()
		ret, err := prog.Run(opts)
		if err != nil {
			return err
		}
		if ret == tcActShot {
			return fmt.Errorf("program dropped the packet")
		}
		per = time.Since(start) / time.Duration(repeat)
		return nil
	})
	if err != nil {
		b.Fatalf("benchmark run: %v", err)
	}
	return per
}
