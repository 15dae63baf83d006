package suite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/perf/traffic"
	"github.com/xdplb/xdplb/tests/child"
	"github.com/xdplb/xdplb/tests/netns"
)

// env is what the modes and scenarios share during a run.
type env struct {
	log  *slog.Logger
	topo *Topology
	dir  string // output directory: logs and services files

	xdplb     string // xdplb binary
	kubeProxy string // kube-proxy binary ("" when unavailable)

	gen      *traffic.Generator // client side: forward traffic
	replyGen *traffic.Generator // node2 side: replies
	pktgen   *traffic.Pktgen    // kernel pktgen, when used
	noPktgen string             // else why not

	cluster *cluster // API server for kube-proxy, started on first use
	// realReady: gen and node2 have the flood scenario's real addresses.
	realReady bool

	threads     int     // generator threads
	frameSize   int     // bytes per frame
	proto       uint8   // TCP, or UDP with pktgen
	calibration float64 // CPU s/Mpkt of the generator and a sink alone
	// netfilter is the edge node's netfilter before the first mode (the
	// zero value, no rules, unless read): every mode leaves it so.
	netfilter netfilterState
	softirqd  []int // pids of ksoftirqd/N
	// controlCPUs are the CPUs the generator leaves (none when it takes
	// them all): the API server, etcd, kube-proxy and the xdplb agent
	// run there, off the packet path's CPU, as on an edge node whose
	// control plane is elsewhere.
	controlCPUs []int
	// warmUp: every mode start runs each scenario once unrecorded first.
	// Fresh maps hand out their entries in memory order, which the first
	// repetition after a start measures; every later one, like a node
	// that has run for a while, gets them back in scattered order (xdplb
	// measured 25-35% faster on the first new-flow repetition).
	warmUp bool
}

// startInNamespace starts bin args... in ns as a [child.Process] on the
// control CPUs, its output appended to logPath.
func (e *env) startInNamespace(ns *netns.NS, logPath, bin string, args ...string) (*child.Process, error) {
	return child.StartOn(filepath.Base(bin), ns.Command(bin, args...), logPath, e.controlCPUs)
}

// checkRunning returns an error, with the end of its log, if p has ended
// (a nil p: none).
func checkRunning(p *child.Process) error {
	if p == nil || !p.Exited() {
		return nil
	}
	return fmt.Errorf("%s exited: %v\n%s", p.Name(), p.Err(), p.LogTail(30))
}

// httpGet fetches a URL from inside the edge node.
func (e *env) httpGet(ctx context.Context, url string) (int, string, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
		return e.topo.Edge.Dial(network, address, net.Dialer{Timeout: time.Second})
	}}
	defer tr.CloseIdleConnections()
	client := http.Client{Transport: tr, Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body), err
}

// flushConntrack empties the kernel's conntrack table in the edge node.
func (e *env) flushConntrack() error {
	err := e.topo.Edge.Do(func() error {
		return netlink.ConntrackTableFlush(netlink.ConntrackTable)
	})
	if err != nil {
		return fmt.Errorf("flush conntrack in the edge node: %w", err)
	}
	return nil
}

// assertClean checks that no datapath is left in the edge node: no XDP or
// tcx program or TC filter on its NICs, and netfilter exactly as before the
// first mode (no kube-proxy rules, and no tables either: empty ones slow
// forwarding down too). A check that cannot be made is an error as well.
func (e *env) assertClean() error {
	var errs []error
	for _, dev := range []string{"eth0", "eth1", "vethpod0"} {
		out, err := e.topo.Edge.IP("-d", "link", "show", dev)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if strings.Contains(out, "prog/xdp") {
			errs = append(errs, fmt.Errorf("%s still has an XDP program", dev))
		}
	}
	for dev, ifindex := range map[string]int{"eth0": e.topo.Eth0, "eth1": e.topo.Eth1, "vethpod0": e.topo.VethPod} {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			var n int
			err := e.topo.Edge.Do(func() error {
				res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
				if err == nil {
					n = len(res.Programs)
				}
				return err
			})
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("query %s's tcx %s programs: %w", dev, at, err))
			case n > 0:
				errs = append(errs, fmt.Errorf("%s still has %d tcx %s program(s)", dev, n, at))
			}
		}
		for _, dir := range []string{"ingress", "egress"} {
			out, err := e.topo.Edge.Exec("tc", "filter", "show", "dev", dev, dir)
			switch {
			case err != nil:
				errs = append(errs, err)
			case strings.TrimSpace(out) != "":
				errs = append(errs, fmt.Errorf("%s still has a TC %s filter", dev, dir))
			}
		}
	}
	errs = append(errs, e.netfilterClean())
	return errors.Join(errs...)
}

// netfilterClean checks the edge node's netfilter is as before the first
// mode. Without nft (no kube-proxy mode can run then), iptables must list
// no table at all.
func (e *env) netfilterClean() error {
	if _, err := exec.LookPath("nft"); err == nil {
		return checkNetfilter(e.topo.Edge, e.netfilter)
	}
	var errs []error
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		if _, err := exec.LookPath(save); err != nil {
			continue
		}
		out, err := e.topo.Edge.Exec(save)
		switch {
		case err != nil:
			errs = append(errs, err)
		case strings.Contains(out, "KUBE-"):
			errs = append(errs, fmt.Errorf("kube-proxy iptables rules are still present: %s", matching(out, "KUBE-", 5)))
		case strings.Contains(out, "\n*"), strings.HasPrefix(out, "*"):
			errs = append(errs, fmt.Errorf("%s lists tables: %s", save, matching(out, "*", 5)))
		}
	}
	return errors.Join(errs...)
}

// matching returns up to n lines of s that contain sub.
func matching(s, sub string, n int) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && len(out) < n {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "; ")
}
