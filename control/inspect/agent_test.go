package inspect

import (
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/testenv"
)

// An agent recorded with its pid in another pid namespace (a DaemonSet's
// pod, where it is often pid 1) is found from this one by that namespace
// and pid, and not mistaken for this namespace's process of that pid.
func TestAgentFoundInItsPIDNamespace(t *testing.T) {
	testenv.RequirePrivileged(t)
	// Looks like an agent: argv[0] "xdplb", an "agent" argument.
	cmd := exec.Command("/bin/sh", "-c", "sleep 60; true", "agent")
	cmd.Args[0] = "xdplb"
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cmd.Process.Kill()
			cmd.Wait()
		}
	}
	defer stop()
	ns := dataplane.PIDNamespaceOf(strconv.Itoa(cmd.Process.Pid))
	if ns == 0 || ns == dataplane.PIDNamespaceOf("self") {
		t.Fatalf("child's pid namespace %d is not a new one", ns)
	}

	// Right after fork the child may not have exec'd yet: wait for it.
	var pid uint32
	var alive bool
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if pid, alive = findAgent(1, ns); alive {
			break
		}
	}
	if !alive || pid != uint32(cmd.Process.Pid) {
		t.Errorf("findAgent(1, its namespace) = %d, %v; want %d, true", pid, alive, cmd.Process.Pid)
	}
	if _, alive := findAgent(1, dataplane.PIDNamespaceOf("self")); alive {
		t.Error("this namespace's pid 1 taken for the agent")
	}
	stop()
	if pid, alive := findAgent(1, ns); alive {
		t.Errorf("stopped agent found as pid %d", pid)
	}
}
