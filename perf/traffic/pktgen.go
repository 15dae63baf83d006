package traffic

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/xdplb/xdplb/tests/netns"
)

// Pktgen drives the kernel's packet generator through pktgen.sh (in
// perf/pktgen), which takes the options of the kernel's samples/pktgen
// scripts. pktgen builds UDP only, and cannot replay a table of tuples, so
// the suite uses it for UDP flows and the BPF generator for the rest.
type Pktgen struct {
	ns     *netns.NS
	dev    string
	script string
	mu     sync.Mutex
	spec   Spec
}

// PktgenAvailable reports whether pktgen exists in namespace ns, and if
// not, why.
func PktgenAvailable(ns *netns.NS) (bool, string) {
	if _, err := ns.Exec("test", "-d", "/proc/net/pktgen"); err != nil {
		return false, "/proc/net/pktgen does not exist (pktgen is not built into or not loaded in this kernel)"
	}
	return true, ""
}

// NewPktgen prepares pktgen on dev in ns, using the script at path.
func NewPktgen(ns *netns.NS, dev, script string) *Pktgen {
	return &Pktgen{ns: ns, dev: dev, script: script}
}

// Configure sets what the next runs send. The spec must be UDP and use
// computed flows.
func (p *Pktgen) Configure(spec Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if spec.Proto != UDP {
		return errors.New("pktgen sends UDP only")
	}
	if len(spec.Tuples) > 0 {
		return errors.New("pktgen cannot replay a tuple table")
	}
	p.mu.Lock()
	p.spec = spec.withDefaults()
	p.mu.Unlock()
	return nil
}

// PktgenArgs returns the pktgen.sh arguments for a run of count packets per
// thread (0: until stopped).
func (s Spec) PktgenArgs(dev string, threads int, count uint64) []string {
	s = s.withDefaults()
	lastDst := AddrAdd(s.Dst, (s.DstAddrs-1)*s.DstStride)
	lastSrc := AddrAdd(s.Src, s.SrcAddrs-1)
	args := []string{
		"-i", dev,
		"-s", strconv.Itoa(s.Size - 4), // pktgen's size includes the FCS
		"-d", s.Dst.String() + "-" + lastDst.String(),
		"-m", s.DstMAC.String(),
		"-p", strconv.Itoa(int(s.DstPort)),
		"-t", strconv.Itoa(max(threads, 1)),
		"-n", strconv.FormatUint(count, 10),
		"-S", s.Src.String() + "-" + lastSrc.String(),
		"-P", fmt.Sprintf("%d-%d", s.SrcPortMin, uint32(s.SrcPortMin)+s.SrcPorts-1),
	}
	if s.Flows > 0 {
		args = append(args, "-F", strconv.FormatUint(uint64(s.Flows), 10), "-L", "1")
	}
	return args
}

// Run sends until opts end it: the count is split over the threads; a
// duration stops the threads through pgctrl.
func (p *Pktgen) Run(ctx context.Context, opts RunOptions) (Result, error) {
	p.mu.Lock()
	spec := p.spec
	p.mu.Unlock()
	if spec.Proto == 0 {
		return Result{}, errors.New("pktgen not configured")
	}
	threads := max(opts.Threads, 1)
	per := opts.Count / uint64(threads)
	if opts.Count > 0 && per == 0 {
		per = 1
	}
	start := time.Now()
	cmd := p.ns.Command("bash", append([]string{p.script}, spec.PktgenArgs(p.dev, threads, per)...)...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return Result{}, fmt.Errorf("start pktgen.sh: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var timer <-chan time.Time
	if opts.Duration > 0 {
		timer = time.After(opts.Duration)
	}
	var err error
	select {
	case err = <-done:
	case <-timer:
		err = p.stopAndWait(cmd, done)
	case <-ctx.Done():
		err = errors.Join(ctx.Err(), p.stopAndWait(cmd, done))
	}
	res := Result{Elapsed: time.Since(start)}
	sent, errs, perr := parsePktgenOutput(out.String())
	res.Sent, res.Errors = sent, errs
	if err != nil {
		return res, fmt.Errorf("pktgen.sh: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return res, perr
}

// stopAndWait stops a timed or cancelled run through pgctrl and waits for
// pktgen.sh; one that does not end within 10 s is killed.
func (p *Pktgen) stopAndWait(cmd *exec.Cmd, done <-chan error) error {
	if _, err := p.ns.Exec("sh", "-c", "echo stop > /proc/net/pktgen/pgctrl"); err != nil {
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("stop pktgen: %w", err)
	}
	select {
	case err := <-done:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return nil // interrupted by the stop, as intended
		}
		return err
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		return errors.New("pktgen did not stop within 10 s; killed")
	}
}

// parsePktgenOutput sums the "DEV@CPU sent N errors E" lines of pktgen.sh.
func parsePktgenOutput(out string) (sent, errs uint64, err error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	lines := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 5 || f[1] != "sent" || f[3] != "errors" || !strings.Contains(f[0], "@") {
			continue
		}
		n, err1 := strconv.ParseUint(f[2], 10, 64)
		e, err2 := strconv.ParseUint(f[4], 10, 64)
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("pktgen.sh output %q: bad numbers", sc.Text())
		}
		sent += n
		errs += e
		lines++
	}
	if lines == 0 {
		return 0, 0, errors.New("pktgen.sh reported no threads")
	}
	return sent, errs, nil
}
