// Command xdplb-demo shows xdplb at work in a sandbox of network
// namespaces (see tests/topology): an external client, an edge node running
// `xdplb agent --services-file` on its NIC, and a second node with three
// backend pods. It checks every step and exits non-zero if one fails;
// everything it creates is removed at the end, also on Ctrl-C.
//
// Usage (as root): xdplb-demo [-xdplb bin/xdplb]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/xdplb/xdplb/tests/topology"
)

func main() {
	binary := flag.String("xdplb", "bin/xdplb", "path of the xdplb binary")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	if err := run(ctx, *binary); err != nil {
		fmt.Fprintf(os.Stderr, "\nDEMO FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("\nDemo passed in %s.\n", time.Since(start).Round(100*time.Millisecond))
}

type demo struct {
	topo     *topology.Topology
	binary   string
	file     string
	pods     []*topology.Pod
	services []topology.Service
	agent    *topology.Agent
}

func step(format string, args ...any) {
	fmt.Printf("\n== "+format+"\n", args...)
}

func run(ctx context.Context, binary string) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("the demo builds network namespaces and loads BPF programs: run it as root")
	}
	abs, err := filepath.Abs(binary)
	if err != nil {
		return err
	}
	if _, err := os.Stat(abs); err != nil {
		return fmt.Errorf("xdplb binary: %w (run `make build` first)", err)
	}
	d := &demo{binary: abs}

	step("Building the sandbox: client, edge node, node2 with three pods")
	d.topo, err = topology.New(ctx)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "xdplb-demo-")
	if err != nil {
		return err
	}
	defer func() {
		if d.agent != nil {
			d.agent.Stop()
			if err != nil {
				fmt.Fprintf(os.Stderr, "\nagent log:\n%s\n", d.agent.Log())
			}
			topology.NodeExec(d.topo.Edge, d.binary, "detach", "--bpffs-root", d.topo.BPFFS)
		}
		d.topo.Close()
		os.RemoveAll(dir)
	}()
	for i := 1; i <= 3; i++ {
		p, err := d.topo.AddPod(d.topo.Node2, fmt.Sprintf("pod-%d", i))
		if err != nil {
			return err
		}
		srv, err := p.StartServer()
		if err != nil {
			return err
		}
		defer srv.Close()
		d.pods = append(d.pods, p)
		fmt.Printf("   %s on %s at %s (HTTP :%d, lines :%d, UDP :%d)\n", p.Name, p.Node.Name, p.Addr,
			topology.HTTPPort, topology.LinePort, topology.UDPPort)
	}

	lb := topology.LBIP(0)
	d.file = filepath.Join(dir, "services.yaml")
	d.services = []topology.Service{
		{Name: "web", Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.10",
			Ports:     []topology.ServicePort{{Name: "http", Port: 80, TargetPort: topology.HTTPPort, NodePort: 30080}},
			Endpoints: d.pods},
		{Name: "shop", Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.11", LBIPs: []string{lb.String()},
			Ports: []topology.ServicePort{
				{Name: "http", Port: 80, TargetPort: topology.HTTPPort, NodePort: 30081},
				{Name: "lines", Port: 9000, TargetPort: topology.LinePort, NodePort: 30082},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: topology.UDPPort, NodePort: 30053},
			},
			Endpoints: d.pods},
	}
	if err := topology.WriteServicesFile(d.file, d.services); err != nil {
		return err
	}
	fmt.Printf("   services file %s: NodePort \"web\" (:30080) and LoadBalancer \"shop\" (%s: 80/TCP, 9000/TCP, 53/UDP)\n", d.file, lb)

	step("Starting the agent on the edge node's NIC")
	fmt.Printf("   xdplb agent --iface eth0 --services-file %s --node-name edge\n", d.file)
	d.agent, err = d.topo.StartAgent(ctx, d.topo.Edge, d.binary, filepath.Join(dir, "agent.log"),
		"--iface", "eth0", "--services-file", d.file, "--node-name", "edge", "--xdp-mode", "native")
	if err != nil {
		return err
	}
	fmt.Println("   agent healthy: /healthz answers 200")

	step("Requests from the client spread over the backends (Maglev)")
	nodePort := net.JoinHostPort(topology.EdgeAddr.String(), "30080")
	httpCounts, err := d.spread(ctx, func() (string, error) { return d.topo.HTTPGet(ctx, nodePort) }, 30)
	if err != nil {
		return err
	}
	dnsAddr := net.JoinHostPort(lb.String(), "53")
	var seen []string
	udpCounts, err := d.spread(ctx, func() (string, error) {
		name, from, err := d.topo.UDPQuery(ctx, dnsAddr)
		seen = append(seen, from)
		return name, err
	}, 30)
	if err != nil {
		return err
	}
	printCounts(map[string]map[string]int{
		"TCP " + nodePort + " (NodePort)": httpCounts,
		"UDP " + dnsAddr + " (LB IP)":     udpCounts,
	}, d.pods)
	for _, counts := range []map[string]int{httpCounts, udpCounts} {
		if len(counts) != len(d.pods) {
			return fmt.Errorf("requests reached %d of %d backends: %v", len(counts), len(d.pods), counts)
		}
	}
	if !strings.HasPrefix(seen[0], topology.EdgeAddr.String()+":") {
		return fmt.Errorf("backend saw the client as %s, want the edge node's address (SNAT to a remote backend)", seen[0])
	}
	fmt.Printf("   backends on node2 see the edge node (%s) as the client: SNAT, so replies return through it\n", seen[0])

	step("xdplb services")
	if err := d.cli("services"); err != nil {
		return err
	}
	step("xdplb conntrack --service default/shop")
	if err := d.cli("conntrack", "--service", "default/shop"); err != nil {
		return err
	}

	step("A long-lived connection keeps its backend while another backend is removed")
	lineAddr := net.JoinHostPort(lb.String(), "9000")
	conn, err := d.topo.OpenLine(lineAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	first, err := conn.Ask()
	if err != nil {
		return err
	}
	fmt.Printf("   connection to %s is served by %s\n", lineAddr, first)
	var removed *topology.Pod
	for _, p := range d.pods {
		if p.Name != first {
			removed = p
			break
		}
	}
	remaining := slices.DeleteFunc(slices.Clone(d.pods), func(p *topology.Pod) bool { return p == removed })
	d.services[1].Endpoints = remaining
	if err := d.applyFile(ctx); err != nil {
		return err
	}
	fmt.Printf("   removed %s from \"shop\" in the services file\n", removed.Name)
	for i := 0; i < 5; i++ {
		again, err := conn.Ask()
		if err != nil {
			return fmt.Errorf("long-lived connection broke: %w", err)
		}
		if again != first {
			return fmt.Errorf("long-lived connection moved from %s to %s", first, again)
		}
	}
	fmt.Printf("   the connection still reaches %s\n", first)
	shopHTTP := net.JoinHostPort(lb.String(), "80")
	counts, err := d.spread(ctx, func() (string, error) { return d.topo.HTTPGet(ctx, shopHTTP) }, 20)
	if err != nil {
		return err
	}
	if counts[removed.Name] > 0 {
		return fmt.Errorf("%d new connections still went to removed %s", counts[removed.Name], removed.Name)
	}
	fmt.Printf("   20 new connections to %s: none to %s %v\n", shopHTTP, removed.Name, counts)

	step("A service without endpoints refuses connections at once")
	d.services[0].Endpoints = nil
	if err := d.applyFile(ctx); err != nil {
		return err
	}
	t0 := time.Now()
	_, err = d.topo.HTTPGet(ctx, nodePort)
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("connecting to %s without endpoints: %v, want connection refused", nodePort, err)
	}
	fmt.Printf("   %s: %v after %s (TCP RST built in XDP)\n", nodePort, errors.Unwrap(err), time.Since(t0).Round(time.Millisecond))

	step("xdplb status")
	if err := d.cli("status"); err != nil {
		return err
	}
	step("Tearing down")
	return nil
}

// spread sends n requests and counts the answering pods.
func (d *demo) spread(ctx context.Context, req func() (string, error), n int) (map[string]int, error) {
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		name, err := req()
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i+1, err)
		}
		counts[name]++
	}
	return counts, nil
}

// applyFile rewrites the services file and waits until the agent applied it.
func (d *demo) applyFile(ctx context.Context) error {
	before, _ := d.syncs()
	if err := topology.WriteServicesFile(d.file, d.services); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if n, err := d.syncs(); err == nil && n > before {
			return d.agent.WaitHealthy(ctx, 5*time.Second)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("the agent did not pick up the services file change")
}

// syncs reads the agent's successful sync count from its metrics.
func (d *demo) syncs() (int, error) {
	_, body, err := d.agent.Get("127.0.0.1:10249", "/metrics")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, `xdplb_syncs_total{result="ok"}`) {
			var n float64
			fmt.Sscanf(strings.Fields(line)[1], "%g", &n)
			return int(n), nil
		}
	}
	return 0, nil
}

func (d *demo) cli(args ...string) error {
	out, err := topology.NodeExec(d.topo.Edge, d.binary, append([]string{args[0], "--bpffs-root", d.topo.BPFFS}, args[1:]...)...)
	fmt.Print(indent(out))
	return err
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = "   " + lines[i]
	}
	return strings.Join(lines, "\n") + "\n"
}

func printCounts(rows map[string]map[string]int, pods []*topology.Pod) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	header := []string{"   TARGET"}
	for _, p := range pods {
		header = append(header, p.Name)
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	keys := make([]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		line := []string{"   " + k}
		for _, p := range pods {
			line = append(line, fmt.Sprint(rows[k][p.Name]))
		}
		fmt.Fprintln(tw, strings.Join(line, "\t"))
	}
	tw.Flush()
}
