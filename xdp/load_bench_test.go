package xdp_test

import (
	"errors"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// verifierLimit is the kernel's bound on the instructions the verifier
// processes for one program (BPF_COMPLEXITY_LIMIT_INSNS).
const verifierLimit = 1_000_000

var processedInsns = regexp.MustCompile(`processed (\d+) insns`)

// BenchmarkProgramLoad loads every datapath object as the agent does (its
// maps unpinned) and reports what the kernel's verifier spent on each
// program: the time of the load (nearly all of it verification) and the
// instructions it processed, of verifierLimit. That budget is what every
// datapath change spends, and what an agent's start-up waits for
// (docs/performance.md).
func BenchmarkProgramLoad(b *testing.B) {
	testenv.RequirePrivileged(b)
	for _, obj := range []struct {
		name string
		load func() (*ebpf.CollectionSpec, error)
	}{
		{"nic", xdp.LoadNic},
		{"nic_ingress", xdp.LoadNicIngress},
		{"pod", xdp.LoadPod},
		{"host_reply", xdp.LoadHostReply},
		{"sock", xdp.LoadSock},
	} {
		b.Run(obj.name, func(b *testing.B) {
			insns := map[string]int{}
			var took time.Duration
			for range b.N {
				spec, err := obj.load()
				if err != nil {
					b.Fatal(err)
				}
				for _, m := range spec.Maps {
					m.Pinning = ebpf.PinNone
				}
				start := time.Now()
				coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
					Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats, LogSizeStart: 1 << 16},
				})
				took += time.Since(start)
				if err != nil {
					var ve *ebpf.VerifierError
					if errors.As(err, &ve) && len(ve.Log) > 0 {
						b.Fatalf("load %s: %v (last verifier line: %s)", obj.name, err, ve.Log[len(ve.Log)-1])
					}
					b.Fatalf("load %s: %v", obj.name, err)
				}
				for name, p := range coll.Programs {
					if m := processedInsns.FindStringSubmatch(p.VerifierLog); m != nil {
						insns[name], _ = strconv.Atoi(m[1])
					}
				}
				coll.Close()
			}
			most := 0
			for name, n := range insns {
				b.Logf("%s: %d instructions processed, %.1f%% of the verifier's limit", name, n,
					100*float64(n)/verifierLimit)
				most = max(most, n)
			}
			b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "load-ms")
			b.ReportMetric(float64(most), "max-insns")
			b.ReportMetric(100*float64(most)/verifierLimit, "%-of-limit")
			b.ReportMetric(0, "ns/op")
		})
	}
}
