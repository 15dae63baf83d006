// Package e2e runs the real xdplb agent in a sandbox of network namespaces
// (tests/topology) and checks what real TCP and UDP connections reach.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/tests/topology"
)

// binary is the xdplb command under test, built once for the package.
var binary string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "xdplb-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "xdplb")
	build := exec.Command("go", "build", "-o", binary, "github.com/xdplb/xdplb/cmd/xdplb")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build xdplb: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// sandbox is a topology with n pods on node2 (and local pods on the edge)
// running their servers, and a services file the test can rewrite.
type sandbox struct {
	t     testing.TB
	topo  *topology.Topology
	pods  []*topology.Pod
	local []*topology.Pod
	file  string
	dir   string
}

func newSandbox(t testing.TB, remotePods, localPods int) *sandbox {
	t.Helper()
	testenv.RequirePrivileged(t)
	testenv.RequireCommand(t, "ethtool")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topo, err := topology.New(ctx)
	if err != nil {
		t.Fatalf("sandbox: %v", err)
	}
	s := &sandbox{t: t, topo: topo, dir: t.TempDir()}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("sandbox teardown: %v", err)
		}
	})
	add := func(n *topology.Node, count int, into *[]*topology.Pod, prefix string) {
		for i := 1; i <= count; i++ {
			p, err := topo.AddPod(n, fmt.Sprintf("%s-%d", prefix, i))
			if err != nil {
				t.Fatal(err)
			}
			srv, err := p.StartServer()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Close)
			*into = append(*into, p)
		}
	}
	add(topo.Node2, remotePods, &s.pods, "remote")
	add(topo.Edge, localPods, &s.local, "local")
	s.file = filepath.Join(s.dir, "services.yaml")
	return s
}

// write replaces the services file.
func (s *sandbox) write(svcs ...topology.Service) {
	s.t.Helper()
	if err := topology.WriteServicesFile(s.file, svcs); err != nil {
		s.t.Fatal(err)
	}
}

// startAgent runs the agent on the edge node's NIC, reading the services
// file; it is stopped and the datapath detached when the test ends.
func (s *sandbox) startAgent(extra ...string) *topology.Agent {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := append([]string{"--iface", "eth0", "--services-file", s.file, "--node-name", "edge",
		"--xdp-mode", "native", "--log-level", "debug"}, extra...)
	a, err := s.topo.StartAgent(ctx, s.topo.Edge, binary, filepath.Join(s.dir, "agent.log"), args...)
	if err != nil {
		s.t.Fatalf("start agent: %v", err)
	}
	s.t.Cleanup(func() {
		a.Stop()
		if s.t.Failed() {
			s.t.Logf("agent log:\n%s", a.Log())
		}
		s.cli("detach")
	})
	return a
}

// cli runs an xdplb command in the edge node against the agent's pins.
func (s *sandbox) cli(args ...string) string {
	s.t.Helper()
	out, err := topology.NodeExec(s.topo.Edge, binary, append([]string{args[0], "--bpffs-root", s.topo.BPFFS}, args[1:]...)...)
	if err != nil {
		s.t.Fatalf("xdplb %v: %v", args, err)
	}
	return out
}
