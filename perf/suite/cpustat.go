package suite

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// userHZ is the unit of /proc/stat: USER_HZ is 100 on every Linux ABI.
const userHZ = 100

// cpuTimes is the aggregate "cpu" line of /proc/stat, in seconds.
type cpuTimes struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal float64
}

// Busy is the time spent running anything: user and kernel code, hard and
// soft interrupts. Packet processing on these paths is softirq and system
// time; steal (the hypervisor running someone else) is excluded.
func (c cpuTimes) Busy() float64 { return c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ }

func (c cpuTimes) sub(o cpuTimes) cpuTimes {
	return cpuTimes{c.User - o.User, c.Nice - o.Nice, c.System - o.System, c.Idle - o.Idle,
		c.IOWait - o.IOWait, c.IRQ - o.IRQ, c.SoftIRQ - o.SoftIRQ, c.Steal - o.Steal}
}

func readCPUTimes() (cpuTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}, fmt.Errorf("read CPU times: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return cpuTimes{}, fmt.Errorf("read CPU times: empty /proc/stat")
	}
	return parseCPULine(sc.Text())
}

func parseCPULine(line string) (cpuTimes, error) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("unexpected /proc/stat line %q", line)
	}
	v := make([]float64, 8)
	for i := range v {
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("/proc/stat field %d: %w", i+1, err)
		}
		v[i] = float64(n) / userHZ
	}
	return cpuTimes{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]}, nil
}

// ksoftirqd finds the per-CPU softirq threads. Softirq work the kernel
// defers (when a burst takes too long inline) runs, and is charged, there.
func ksoftirqd() ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err == nil && strings.HasPrefix(string(comm), "ksoftirqd/") {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// taskCPU sums the user and system time of tasks, in seconds.
func taskCPU(pids []int) (float64, error) {
	var total float64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return 0, fmt.Errorf("read task %d: %w", pid, err)
		}
		t, err := parseTaskStat(string(b))
		if err != nil {
			return 0, fmt.Errorf("task %d: %w", pid, err)
		}
		total += t
	}
	return total, nil
}

// parseTaskStat returns utime + stime of a /proc/<pid>/stat line, in
// seconds. The command name may contain spaces and parentheses: fields
// are counted from the last ')'.
func parseTaskStat(line string) (float64, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected stat line %q", line)
	}
	f := strings.Fields(line[i+1:])
	// f[0] is the state (field 3); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected stat line %q", line)
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("unexpected stat times in %q", line)
	}
	return float64(u+s) / userHZ, nil
}
