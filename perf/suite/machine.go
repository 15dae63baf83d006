package suite

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/perf/summary"
)

// machineFacts collects what the report's header says about the machine.
func machineFacts(e *env) summary.Machine {
	m := summary.Machine{
		CPUs:      runtime.NumCPU(),
		GoVersion: runtime.Version(),
		Threads:   e.threads,
		XDPMode:   "native",
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		m.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	m.CPU = cpuModel()
	m.MemoryGiB = memoryGiB()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAverage = strings.Join(f[:3], " ")
		}
	}
	if out, err := e.topo.Edge.Exec("ethtool", "-i", "eth0"); err == nil {
		for _, l := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(l, "driver: "); ok {
				m.NICDriver = strings.TrimSpace(v)
			}
		}
	}
	if m.NICDriver == "veth" {
		m.XDPMode = "native (veth, network namespaces)"
	}
	if e.pktgen != nil {
		m.Generator = "kernel pktgen (pktgen.sh)"
	} else {
		m.Generator = "BPF_PROG_TEST_RUN live frames (xdp_gen)"
		m.NoPktgen = e.noPktgen
	}
	if e.xdplb != "" {
		if out, err := exec.Command(e.xdplb, "version").Output(); err == nil {
			first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
			m.XDPLB = first
		}
	}
	if e.kubeProxy != "" {
		if out, err := exec.Command(e.kubeProxy, "--version").Output(); err == nil {
			m.KubeProxy = strings.TrimSpace(string(out))
		}
	}
	m.FrameBytes = e.frameSize
	return m
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return runtime.GOARCH
}

func memoryGiB() float64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseFloat(fields[1], 64)
			if err == nil {
				return kb / (1 << 20)
			}
		}
	}
	return 0
}
