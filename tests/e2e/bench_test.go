package e2e

import (
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/tests/topology"
)

// BenchmarkPodToClusterIP measures short connections (connect, one
// request line, answer, close) from a pod to a ClusterIP, through xdplb
// and, in the same run, through kube-proxy-style iptables DNAT rules in
// the node, with the same pods. It reports connections per second.
func BenchmarkPodToClusterIP(b *testing.B) {
	rates := map[string]float64{}
	for _, mode := range []string{"xdplb", "iptables"} {
		b.Run(mode, func(b *testing.B) {
			rate := podToClusterIPRate(b, mode)
			rates[mode] = rate
			b.ReportMetric(rate, "conn/s")
			b.ReportMetric(0, "ns/op")
		})
	}
	if rates["iptables"] > 0 {
		fmt.Printf("pod -> ClusterIP short connections: xdplb %.0f/s, iptables %.0f/s, ratio %.2fx\n",
			rates["xdplb"], rates["iptables"], rates["xdplb"]/rates["iptables"])
	}
}

func podToClusterIPRate(b *testing.B, mode string) float64 {
	testenv.RequirePrivileged(b)
	s := newSandbox(b, 1, 2)
	client, backend := s.local[0], s.local[1]
	svc := lines("bench", "10.96.1.9", backend, s.pods[0])
	switch mode {
	case "xdplb":
		s.write(svc)
		s.startAgent()
	case "iptables":
		testenv.RequireCommand(b, "iptables")
		installKubeProxyRules(b, s, "10.96.1.9", 9000, []*topology.Pod{backend, s.pods[0]})
	}
	const conns = 1000
	var elapsed time.Duration
	// The whole loop runs on a thread inside the pod's namespace, so the
	// client costs one connect, write, read and close per connection.
	err := client.Do(func() error {
		buf := make([]byte, 128)
		start := time.Now()
		for i := 0; i < conns; i++ {
			c, err := net.DialTimeout("tcp4", "10.96.1.9:9000", 3*time.Second)
			if err != nil {
				return fmt.Errorf("connection %d: %w", i, err)
			}
			c.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := c.Write([]byte("ping\n")); err != nil {
				c.Close()
				return fmt.Errorf("connection %d: %w", i, err)
			}
			if _, err := c.Read(buf); err != nil {
				c.Close()
				return fmt.Errorf("connection %d: %w", i, err)
			}
			c.Close()
		}
		elapsed = time.Since(start)
		return nil
	})
	if err != nil {
		b.Fatalf("%s: %v", mode, err)
	}
	return conns / elapsed.Seconds()
}

// installKubeProxyRules writes the nat rules kube-proxy's iptables mode
// uses for one ClusterIP port: KUBE-SERVICES, a KUBE-SVC chain choosing an
// endpoint at random, a KUBE-SEP chain per endpoint doing the DNAT.
func installKubeProxyRules(b *testing.B, s *sandbox, ip string, port int, eps []*topology.Pod) {
	b.Helper()
	ipt := func(args ...string) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", s.topo.Edge.NS.Name, "iptables", "-t", "nat"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("iptables %v: %v: %s", args, err, out)
		}
	}
	ipt("-N", "KUBE-SERVICES")
	ipt("-A", "PREROUTING", "-j", "KUBE-SERVICES")
	ipt("-A", "OUTPUT", "-j", "KUBE-SERVICES")
	ipt("-N", "KUBE-SVC-BENCH")
	ipt("-A", "KUBE-SERVICES", "-d", ip+"/32", "-p", "tcp", "--dport", fmt.Sprint(port), "-j", "KUBE-SVC-BENCH")
	for i, p := range eps {
		sep := fmt.Sprintf("KUBE-SEP-BENCH%d", i)
		ipt("-N", sep)
		ipt("-A", sep, "-p", "tcp", "-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", p.Addr, topology.LinePort))
		if i < len(eps)-1 {
			ipt("-A", "KUBE-SVC-BENCH", "-m", "statistic", "--mode", "random",
				"--probability", fmt.Sprintf("%.5f", 1/float64(len(eps)-i)), "-j", sep)
		} else {
			ipt("-A", "KUBE-SVC-BENCH", "-j", sep)
		}
	}
}
