package suite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/perf/traffic"
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

	cluster *cluster // API server for kube-proxy, started on first use

	threads     int     // generator threads
	frameSize   int     // bytes per frame
	proto       uint8   // TCP, or UDP with pktgen
	calibration float64 // CPU s/Mpkt of the generator and a sink alone
	softirqd    []int   // pids of ksoftirqd/N
}

// process is a child running in a namespace with its output in a log file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startProcess runs name args... in ns, appending its output to logPath.
func startProcess(ns *netns.NS, logPath, name string, args ...string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", logPath, err)
	}
	fmt.Fprintf(logf, "==== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), name, strings.Join(args, " "))
	cmd := ns.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Should this process die, its children go too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: filepath.Base(name), cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// check returns an error if the process is gone (nil process: none).
func (p *process) check() error {
	if p == nil || !p.exited() {
		return nil
	}
	return fmt.Errorf("%s exited: %v\n%s", p.name, p.err, p.tail(30))
}

// stop sends SIGTERM and, after grace, SIGKILL.
func (p *process) stop(grace time.Duration) error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return fmt.Errorf("%s ignored SIGTERM for %s", p.name, grace)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// tail returns the last lines of the process log.
func (p *process) tail(n int) string { return fileTail(p.log, n) }

func fileTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
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

// assertClean checks that no datapath is left in the edge node: no XDP
// program on its NICs and no kube-proxy rules, so the next mode is the
// only one handling traffic.
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
			if err == nil && n > 0 {
				errs = append(errs, fmt.Errorf("%s still has %d tcx %s program(s)", dev, n, at))
			}
		}
		out, err := e.topo.Edge.Exec("tc", "filter", "show", "dev", dev, "ingress")
		if err == nil && strings.TrimSpace(out) != "" {
			errs = append(errs, fmt.Errorf("%s still has a TC ingress filter", dev))
		}
	}
	if _, err := exec.LookPath("iptables-save"); err == nil {
		out, err := e.topo.Edge.Exec("iptables-save")
		if err == nil && strings.Contains(out, "KUBE-") {
			errs = append(errs, fmt.Errorf("kube-proxy iptables rules are still present: %s", matching(out, "KUBE-", 5)))
		}
	}
	if _, err := exec.LookPath("nft"); err == nil {
		out, err := e.topo.Edge.Exec("nft", "list", "tables")
		if err == nil && strings.Contains(out, "kube-proxy") {
			errs = append(errs, errors.New("kube-proxy nftables table is still present"))
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
