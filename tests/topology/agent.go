package topology

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/xdplb/xdplb/tests/child"
)

// Agent is an xdplb agent process running in a node's namespace.
type Agent struct {
	proc    *child.Process
	node    *Node
	LogPath string
	Healthz string // address of /healthz inside the node
}

// StartAgent runs `xdplb agent args...` in the node's namespace with the
// sandbox's pins and cgroup view, its log in logPath, and waits until
// /healthz answers 200 (the first sync is done) or ctx ends.
func (t *Topology) StartAgent(ctx context.Context, n *Node, binary, logPath string, args ...string) (*Agent, error) {
	return StartNodeAgent(ctx, n, binary, t.BPFFS, logPath, append([]string{"--cgroup-root", t.Cgroup}, args...)...)
}

// Get fetches a path from the agent's health or metrics server.
func (a *Agent) Get(addr, path string) (int, string, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
		return a.node.Dial(network, address, net.Dialer{Timeout: time.Second})
	}}
	defer tr.CloseIdleConnections()
	client := http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// WaitHealthy polls /healthz until it answers 200.
func (a *Agent) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-a.proc.Done():
			return fmt.Errorf("agent exited: %v", a.proc.Err())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if code, _, err := a.Get(a.Healthz, "/healthz"); err == nil && code == http.StatusOK {
			return nil
		}
	}
	return errors.New("agent not healthy in time")
}

// Stop sends SIGTERM and waits for the agent to exit (SIGKILL after 10 s,
// which is an error); it returns how the agent exited.
func (a *Agent) Stop() error {
	if err := a.proc.Stop(10 * time.Second); err != nil {
		return err
	}
	return a.proc.Err()
}

// Log returns the agent's log so far.
func (a *Agent) Log() string {
	b, _ := os.ReadFile(a.LogPath)
	return string(b)
}

// CLI runs an xdplb command in the node's namespace against the same pins.
func (t *Topology) CLI(n *Node, binary string, args ...string) (string, error) {
	full := append([]string{args[0], "--bpffs-root", t.BPFFS}, args[1:]...)
	return n.Exec(binary, full...)
}

// NodeExec runs a program in the node's namespace and returns its output.
func NodeExec(n *Node, binary string, args ...string) (string, error) {
	return n.Exec(binary, args...)
}
