package traffic

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/xdp"
	"github.com/xdplb/xdplb/xdp/baseline"
)

// liveFrames is BPF_F_TEST_XDP_LIVE_FRAMES: transmit what the program
// returns XDP_TX or XDP_REDIRECT for.
const liveFrames = 1 << 1

// xdpMD mirrors struct xdp_md, the context of an XDP test run.
type xdpMD struct {
	Data, DataEnd, DataMeta    uint32
	IngressIfindex, RxQueueIdx uint32
	EgressIfindex              uint32
}

// Generator sends frames out of one device with xdp_gen in live-frames
// mode. Its flow sequence continues across runs, so a new-flow spec never
// repeats a tuple between runs until it wraps.
type Generator struct {
	ns      *netns.NS
	dev     string
	ifindex int
	objs    baseline.XDPObjects
	slots   int
	// hold keeps xdp_gen attached to a spare device (see holdInDispatcher).
	hold    link.Link
	holdDev string

	mu    sync.Mutex
	spec  Spec
	frame []byte
}

// NewGenerator loads the generator for device dev in namespace ns.
func NewGenerator(ns *netns.NS, dev string) (*Generator, error) {
	g := &Generator{ns: ns, dev: dev}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("count possible CPUs: %w", err)
	}
	g.slots = cpus
	err = ns.Do(func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		g.ifindex = ifi.Index
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("generator device %s in %s: %w", dev, ns.Name, err)
	}
	if err := baseline.LoadXDPObjects(&g.objs, nil); err != nil {
		return nil, fmt.Errorf("load generator program: %w", err)
	}
	if err := g.holdInDispatcher(); err != nil {
		g.objs.Close()
		return nil, err
	}
	return g, nil
}

// holdInDispatcher attaches xdp_gen in native mode to a spare veth of the
// generator's namespace that is never up. A BPF_PROG_TEST_RUN with
// repetitions puts its program into the kernel's XDP dispatcher for the
// call and takes it out after, each change waiting for an RCU grace
// period: two per call, 10-25 ms together on a kernel with a slow tick,
// which capped the generator at one 256-frame call per 25 ms (10k
// frames a second) and kept its calls from growing. A program attached
// to a device in native mode stays in the dispatcher, so the calls change
// nothing there.
func (g *Generator) holdInDispatcher() error {
	g.holdDev = fmt.Sprintf("xgenhold%d", g.ifindex)
	return g.ns.Do(func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: g.holdDev}, PeerName: g.holdDev + "p"}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("generator: spare device %s: %w", g.holdDev, err)
		}
		dev, err := netlink.LinkByName(g.holdDev)
		if err == nil {
			g.hold, err = link.AttachXDP(link.XDPOptions{Program: g.objs.XdpGen, Interface: dev.Attrs().Index,
				Flags: link.XDPDriverMode})
		}
		if err != nil {
			netlink.LinkDel(veth) //nolint:errcheck // the error returned says what failed
			return fmt.Errorf("generator: attach to spare device %s: %w", g.holdDev, err)
		}
		return nil
	})
}

// Close releases the program, its maps and its spare device.
func (g *Generator) Close() error {
	var errs []error
	if g.hold != nil {
		errs = append(errs, g.hold.Close())
		errs = append(errs, g.ns.Do(func() error {
			dev, err := netlink.LinkByName(g.holdDev)
			if err != nil {
				return nil // gone with its namespace
			}
			return netlink.LinkDel(dev)
		}))
	}
	errs = append(errs, g.objs.Close())
	return errors.Join(errs...)
}

// Configure sets what the next runs send.
func (g *Generator) Configure(spec Spec) error {
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("generator spec: %w", err)
	}
	spec = spec.withDefaults()
	frame := spec.Template()
	cfg := configOf(spec, frame, g.slots)
	if len(spec.Tuples) > 0 {
		keys := make([]uint32, len(spec.Tuples))
		vals := make([]baseline.XDPGenTuple, len(spec.Tuples))
		for i, t := range spec.Tuples {
			keys[i] = uint32(i)
			vals[i] = baseline.XDPGenTuple{
				Saddr: xdp.AddrToNet(t.Src), Daddr: xdp.AddrToNet(t.Dst),
				Sport: xdp.PortToNet(t.SrcPort), Dport: xdp.PortToNet(t.DstPort),
			}
		}
		if _, err := g.objs.GenTuples.BatchUpdate(keys, vals, nil); err != nil {
			return fmt.Errorf("write %d generator tuples: %w", len(keys), err)
		}
	}
	if err := g.objs.GenCfg.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("write generator configuration: %w", err)
	}
	g.mu.Lock()
	g.spec, g.frame = spec, frame
	g.mu.Unlock()
	return nil
}

// configOf is the program's view of a spec.
func configOf(spec Spec, frame []byte, slots int) baseline.XDPGenConfig {
	cfg := baseline.XDPGenConfig{
		Flows:       spec.Flows,
		Saddr:       xdp.AddrToNet(spec.Src),
		SaddrCount:  spec.SrcAddrs,
		SportMin:    uint32(spec.SrcPortMin),
		SportCount:  spec.SrcPorts,
		Daddr:       xdp.AddrToNet(spec.Dst),
		DaddrCount:  spec.DstAddrs,
		DaddrStride: spec.DstStride,
		Slots:       uint32(slots),
	}
	if len(spec.Tuples) > 0 {
		cfg.UseTuples = 1
		cfg.Flows = uint32(len(spec.Tuples))
	}
	if spec.Proto == TCP {
		cfg.Tcp = 1
	}
	copy(cfg.Hdr[:], frame)
	return cfg
}

// RunOptions bound one run: it stops at Count frames or after Duration,
// whichever comes first (at least one of them must be set). A call that a
// signal interrupts (the Go runtime preempts with SIGURG) is started over
// whole by the ebpf library, so a run may send up to one call's frames
// more than Count; Result.Sent, read from the generator's own counters,
// says what it sent.
type RunOptions struct {
	Count    uint64
	Duration time.Duration
	// Threads run in parallel, thread i pinned to CPU i modulo the CPUs
	// this process may use. Default 1.
	Threads int
	// Chunk is the most frames one BPF_PROG_TEST_RUN call sends; the
	// bounds are checked between calls. Default 65536.
	Chunk uint32
}

// Result is what a run sent.
type Result struct {
	Sent    uint64 // frames the program generated and returned XDP_TX for
	Errors  uint64 // frames it could not build
	Elapsed time.Duration
	// CPU is the CPU time (user and system) of the generator threads. The
	// receivers of a veth pair process what it sends in the sender's
	// softirq, on the same CPU, so it includes their work too, unless the
	// kernel deferred that to ksoftirqd.
	CPU time.Duration
}

// Sent returns the frames generated so far (all runs), from the program's
// own per-CPU counters.
func (g *Generator) Sent() (sent, errs uint64, err error) {
	var per []baseline.XDPGenState
	if err := g.objs.GenCounters.Lookup(uint32(0), &per); err != nil {
		return 0, 0, fmt.Errorf("read generator counters: %w", err)
	}
	for _, c := range per {
		sent += c.Seq
		errs += c.Errors
	}
	return sent, errs, nil
}

// Run sends until the options' bounds or ctx end it.
func (g *Generator) Run(ctx context.Context, opts RunOptions) (Result, error) {
	if opts.Count == 0 && opts.Duration <= 0 {
		return Result{}, errors.New("generator run needs a frame count or a duration")
	}
	g.mu.Lock()
	frame := g.frame
	g.mu.Unlock()
	if frame == nil {
		return Result{}, errors.New("generator not configured")
	}
	threads := max(opts.Threads, 1)
	chunk := opts.Chunk
	if chunk == 0 {
		chunk = 65536
	}
	cpus, err := allowedCPUs()
	if err != nil {
		return Result{}, err
	}
	sentBefore, errsBefore, err := g.Sent()
	if err != nil {
		return Result{}, err
	}
	var deadline time.Time
	if opts.Duration > 0 {
		deadline = time.Now().Add(opts.Duration)
	}
	start := time.Now()
	errc := make(chan error, threads)
	cpuc := make(chan time.Duration, threads)
	for t := 0; t < threads; t++ {
		share := opts.Count / uint64(threads)
		if uint64(t) < opts.Count%uint64(threads) {
			share++
		}
		if opts.Count > 0 && share == 0 {
			errc <- nil
			cpuc <- 0
			continue
		}
		cpu := cpus[t%len(cpus)]
		go func() {
			var used time.Duration
			errc <- g.ns.Do(func() error {
				return pinned(cpu, func() error {
					before, err := threadCPU()
					if err != nil {
						return err
					}
					lerr := g.loop(ctx, frame, share, deadline, chunk)
					after, err := threadCPU()
					used = after - before
					return errors.Join(lerr, err)
				})
			})
			cpuc <- used
		}()
	}
	var errs []error
	var cpuUsed time.Duration
	for t := 0; t < threads; t++ {
		if err := <-errc; err != nil {
			errs = append(errs, err)
		}
		cpuUsed += <-cpuc
	}
	elapsed := time.Since(start)
	sentAfter, errsAfter, err := g.Sent()
	if err != nil {
		errs = append(errs, err)
	}
	res := Result{Sent: sentAfter - sentBefore, Errors: errsAfter - errsBefore, Elapsed: elapsed, CPU: cpuUsed}
	return res, errors.Join(errs...)
}

// chunkTarget is how long one BPF_PROG_TEST_RUN call should take: the
// run's bounds and ctx are checked between calls.
const chunkTarget = 25 * time.Millisecond

// loop sends count frames (0: unbounded) until the deadline (zero: none)
// or ctx ends. Calls start small and grow (up to maxChunk frames) to about
// chunkTarget each, so a slow datapath cannot overrun the deadline by much.
func (g *Generator) loop(ctx context.Context, frame []byte, count uint64, deadline time.Time, maxChunk uint32) error {
	var done uint64
	chunk := uint64(min(256, maxChunk))
	for count == 0 || done < count {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return nil
		}
		n := chunk
		if count > 0 {
			n = min(n, count-done)
		}
		t0 := time.Now()
		_, err := g.objs.XdpGen.Run(&ebpf.RunOptions{
			Data:    frame,
			Repeat:  uint32(n),
			Flags:   liveFrames,
			Context: xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(g.ifindex)},
		})
		if err != nil {
			return fmt.Errorf("live-frames run on %s: %w", g.dev, err)
		}
		done += n
		took := time.Since(t0)
		switch {
		case took < chunkTarget/2:
			chunk = min(chunk*2, uint64(maxChunk))
		case took > chunkTarget*2:
			chunk = max(chunk/2, 64)
		}
	}
	return nil
}

// Once runs the generator on one frame without transmitting it and
// returns the frame it built: what a live run would send next. The input
// is the template with its headers overwritten with garbage, the way a
// live-frames page comes back after a forwarding path rewrote it.
func (g *Generator) Once() ([]byte, error) {
	g.mu.Lock()
	frame := g.frame
	g.mu.Unlock()
	if frame == nil {
		return nil, errors.New("generator not configured")
	}
	in := bytes.Clone(frame)
	for i := range in[:HeaderLen] {
		in[i] = byte(0xa5 ^ i)
	}
	out := make([]byte, len(frame)+256)
	ret, err := g.objs.XdpGen.Run(&ebpf.RunOptions{Data: in, DataOut: out})
	if err != nil {
		return nil, fmt.Errorf("generator test run: %w", err)
	}
	if ret != xdpTX {
		return nil, fmt.Errorf("generator returned %d, want XDP_TX", ret)
	}
	return out[:len(frame)], nil
}

// xdpTX is the XDP_TX verdict.
const xdpTX = 3

// threadCPU is the calling thread's CPU time so far. The thread CPU
// clock counts the running thread's time up to now; getrusage counts it
// as of the last tick or switch, which reads a run shorter than a tick,
// without a switch, as no time at all.
func threadCPU() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, fmt.Errorf("thread CPU time: %w", err)
	}
	return time.Duration(ts.Nano()), nil
}

// allowedCPUs lists the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("read CPU affinity: %w", err)
	}
	var cpus []int
	for i := 0; i < 1024 && len(cpus) < set.Count(); i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) == 0 {
		return nil, errors.New("no CPU in this process's affinity mask")
	}
	return cpus, nil
}

// SplitCPUs returns the CPUs of this process that generator threads run
// on (Run pins thread t to the t-th, wrapping round) and those left over,
// for whatever should keep off the packet path.
func SplitCPUs(threads int) (generator, rest []int, err error) {
	cpus, err := allowedCPUs()
	if err != nil {
		return nil, nil, err
	}
	generator, rest = splitCPUs(cpus, threads)
	return generator, rest, nil
}

func splitCPUs(cpus []int, threads int) (generator, rest []int) {
	n := min(max(threads, 1), len(cpus))
	return cpus[:n:n], cpus[n:]
}

// pinned runs fn on the calling OS thread bound to one CPU, and restores
// the thread's affinity afterwards (the thread goes back to the Go
// scheduler's pool).
func pinned(cpu int, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var orig, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &orig); err != nil {
		return fmt.Errorf("read thread affinity: %w", err)
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return fmt.Errorf("pin generator thread to CPU %d: %w", cpu, err)
	}
	ferr := fn()
	if err := unix.SchedSetaffinity(0, &orig); err != nil {
		// Keep the thread locked (and so retired) rather than hand a
		// pinned thread back to the scheduler.
		runtime.LockOSThread()
		return errors.Join(ferr, fmt.Errorf("restore thread affinity: %w", err))
	}
	return ferr
}
