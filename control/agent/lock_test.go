package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/testenv"
)

// holdPinLockEnv makes the test binary a process that takes the lock on
// the pin root it names, says "locked" and waits to be killed.
const holdPinLockEnv = "XDPLB_TEST_HOLD_PIN_LOCK"

func TestHelperHoldPinLock(t *testing.T) {
	root := os.Getenv(holdPinLockEnv)
	if root == "" {
		t.Skip("helper process for TestPinLockDiesWithItsHolder")
	}
	l, err := TryLockPins(root)
	if err != nil || l == nil {
		fmt.Println("lock:", err)
		os.Exit(1)
	}
	fmt.Println("locked")
	time.Sleep(time.Hour)
}

// holdPinLock starts a process holding the lock on root; it is killed when
// the test ends.
func holdPinLock(t *testing.T, root string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldPinLock$")
	cmd.Env = append(os.Environ(), holdPinLockEnv+"="+root)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("lock holder said %q (%v)", line, err)
	}
	return cmd
}

// A process holding the lock is found with its pid; when it dies without
// releasing it (SIGKILL), the kernel does, and an agent takes the pins.
func TestPinLockDiesWithItsHolder(t *testing.T) {
	root := testenv.BPFFS(t)
	if err := os.Mkdir(filepath.Join(root, "xdplb"), 0o700); err != nil {
		t.Fatal(err)
	}
	holder := holdPinLock(t, root)

	held, pid, err := PinsLocked(root)
	if err != nil || !held || pid != holder.Process.Pid {
		t.Fatalf("PinsLocked = %v, pid %d, %v; want held by pid %d", held, pid, err, holder.Process.Pid)
	}
	l, err := TryLockPins(root)
	var busy *PinsInUseError
	if !errors.As(err, &busy) || busy.PID != holder.Process.Pid {
		l.Unlock()
		t.Fatalf("TryLockPins under a holder: %v, want a PinsInUseError naming pid %d", err, holder.Process.Pid)
	}
	if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("pid %d", holder.Process.Pid)) || !strings.Contains(msg, root) {
		t.Errorf("error %q does not name the holder's pid and the pin root", msg)
	}

	holder.Process.Signal(syscall.SIGKILL)
	holder.Wait()
	if held, _, err := PinsLocked(root); err != nil || held {
		t.Fatalf("after the holder was killed: PinsLocked = %v, %v; want free", held, err)
	}
	l, err = lockPins(root, discard())
	if err != nil {
		t.Fatalf("lock after the holder was killed: %v", err)
	}
	l.Unlock()
}

// A second agent on the same pins fails before it loads or attaches
// anything: the first keeps its interface, the second's is left alone.
// Once the first stops, the lock is free for the next one. A started
// agent records its pid at once, not at its first sync.
func TestSecondAgentOnThePinsFails(t *testing.T) {
	ns := testenv.NewNetns(t, "lock")
	for _, name := range []string{"edge0", "edge2"} {
		peer := "peer" + strings.TrimPrefix(name, "edge")
		ns.IP("link", "add", name, "type", "veth", "peer", "name", peer)
		ns.IP("link", "set", name, "up")
		ns.IP("link", "set", peer, "up")
	}
	services := filepath.Join(t.TempDir(), "services.yaml")
	if err := os.WriteFile(services, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	opts := loader.DefaultOptions()
	opts.PinRoot = testenv.BPFFS(t)
	opts.ConntrackMax, opts.NATMax, opts.AffinityMax = 1024, 1024, 256
	cfg := Config{Interfaces: []string{"edge0"}, XDPMode: loader.XDPNative, Datapath: opts, ServicesFile: services}
	xdpProg := func(name string) uint32 {
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if x := l.Attrs().Xdp; x != nil && x.Attached {
			return x.ProgId
		}
		return 0
	}
	err := ns.Do(func() error {
		first, err := Start(context.Background(), cfg, discard())
		if err != nil {
			return fmt.Errorf("first agent: %w", err)
		}
		as, err := first.plane.AgentState()
		if err != nil || as.PID != uint32(os.Getpid()) || as.Syncs != 0 || as.Started.IsZero() {
			first.Close()
			return fmt.Errorf("after Start the agent state is %+v (%v); want this pid, started, no syncs", as, err)
		}
		prog := xdpProg("edge0")

		second := cfg
		second.Interfaces = []string{"edge2"}
		a, err := Start(context.Background(), second, discard())
		var busy *PinsInUseError
		if !errors.As(err, &busy) || busy.PID != os.Getpid() {
			if a != nil {
				a.Close()
			}
			first.Close()
			return fmt.Errorf("second agent on the same pins: %v; want a PinsInUseError naming pid %d", err, os.Getpid())
		}
		if got := xdpProg("edge0"); got != prog || got == 0 {
			t.Errorf("the second agent changed the first one's edge0: XDP program %d, was %d", got, prog)
		}
		if got := xdpProg("edge2"); got != 0 {
			t.Errorf("the second agent attached edge2 (XDP program %d)", got)
		}
		if !loader.NICAttached(opts.PinRoot, "edge0") {
			t.Error("the first agent's edge0 links are no longer pinned")
		}

		first.Close()
		a, err = Start(context.Background(), second, discard())
		if err != nil {
			return fmt.Errorf("an agent after the first stopped: %w", err)
		}
		a.Close()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
