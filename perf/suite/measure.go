package suite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/xdplb/xdplb/perf/summary"
	"github.com/xdplb/xdplb/perf/traffic"
	"github.com/xdplb/xdplb/tests/packet"
)

// sender is what sends a run: the BPF generator or pktgen.
type sender interface {
	Configure(traffic.Spec) error
	Run(context.Context, traffic.RunOptions) (traffic.Result, error)
}

// sample is the sink's count at a moment of a run.
type sample struct {
	at      time.Duration
	arrived uint64
}

// rep is one repetition of a scenario.
type rep struct {
	sent, arrived uint64
	elapsed       time.Duration
	// pipelineCPU is the CPU time of the generator threads (which carry
	// the node's and the sinks' softirq work) plus ksoftirqd, in seconds;
	// cpu is the whole machine's, other processes included.
	pipelineCPU   float64
	cpu           cpuTimes
	before, after *observation
	timeline      []sample
	flood         *summary.Flood // the flood scenario's own figures
}

func (r rep) mpps() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.arrived) / r.elapsed.Seconds() / 1e6
}

// drain is how long in-flight frames get to reach the sink after a run.
const drain = 100 * time.Millisecond

// forwardSender picks the generator for client-side traffic.
func (e *env) forwardSender() sender {
	if e.pktgen != nil {
		return e.pktgen
	}
	return e.gen
}

// send runs spec through s for opts and returns what the sink counted,
// sampling it while the run lasts.
func (e *env) send(ctx context.Context, s sender, spec traffic.Spec, sink *traffic.Sink, opts traffic.RunOptions,
	observe func() (*observation, error)) (rep, error) {
	var r rep
	if err := s.Configure(spec); err != nil {
		return r, err
	}
	var err error
	if observe != nil {
		if r.before, err = observe(); err != nil {
			return r, err
		}
	}
	base, err := sink.Packets()
	if err != nil {
		return r, err
	}
	cpu0, err := readCPUTimes()
	if err != nil {
		return r, err
	}
	soft0, err := taskCPU(e.softirqd)
	if err != nil {
		return r, err
	}
	opts.Threads = e.threads
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if n, err := sink.Packets(); err == nil {
					r.timeline = append(r.timeline, sample{time.Since(start), n - base})
				}
			}
		}
	}()
	res, runErr := s.Run(ctx, opts)
	close(stop)
	wg.Wait()
	cpu1, cerr := readCPUTimes()
	soft1, kerr := taskCPU(e.softirqd)
	time.Sleep(drain)
	after, serr := sink.Packets()
	if err := errors.Join(runErr, cerr, kerr, serr); err != nil {
		return r, err
	}
	r.sent, r.elapsed, r.arrived = res.Sent, res.Elapsed, after-base
	if e.log.Enabled(ctx, slog.LevelDebug) {
		var rates []string
		var prev sample
		for _, s := range r.timeline {
			if d := s.at - prev.at; d > 0 {
				rates = append(rates, fmt.Sprintf("%.2f", float64(s.arrived-prev.arrived)/d.Seconds()/1e6))
			}
			prev = s
		}
		e.log.Debug("run", "sent", r.sent, "arrived", r.arrived, "elapsed", r.elapsed, "mpps_per_10ms", strings.Join(rates, " "))
	}
	r.cpu = cpu1.sub(cpu0)
	r.pipelineCPU = res.CPU.Seconds() + (soft1 - soft0)
	if res.CPU == 0 {
		// pktgen's kernel threads: only the machine-wide figure is known.
		r.pipelineCPU = r.cpu.Busy()
	}
	if res.Errors > 0 {
		return r, fmt.Errorf("generator could not build %d frames", res.Errors)
	}
	if observe != nil {
		if r.after, err = observe(); err != nil {
			return r, err
		}
	}
	return r, nil
}

// measure runs one repetition of a scenario against a started mode.
func (e *env) measure(ctx context.Context, m mode, sc scenario, set ServiceSet) (rep, error) {
	if err := m.reset(ctx, e); err != nil {
		return rep{}, fmt.Errorf("reset: %w", err)
	}
	if sc.traffic == trafficFlood {
		return e.measureFlood(ctx, m, sc, set)
	}
	fwd := e.forwardSender()
	if sc.prefill > 0 {
		n := uint64(sc.prefill * conntrackMax)
		spec := newFlowSpec(e, sc, set, prefillSrc, 1<<16)
		r, err := e.send(ctx, fwd, spec, sinkOf(e, sc), traffic.RunOptions{Count: n, Duration: 60 * time.Second}, nil)
		if err != nil {
			return rep{}, fmt.Errorf("prefill: %w", err)
		}
		if r.arrived < n*9/10 {
			return rep{}, fmt.Errorf("prefill: only %d of %d flows got through", r.arrived, n)
		}
		e.log.Debug("conntrack prefilled", "flows", r.arrived, "took", r.elapsed.Round(time.Millisecond))
	}
	var spec traffic.Spec
	s := fwd
	switch sc.traffic {
	case trafficNew:
		spec = newFlowSpec(e, sc, set, newFlowSrc, 1<<20)
	case trafficEstablished, trafficReply:
		spec = establishedSpec(e, sc, set)
		if tracksHandshakes(m) {
			if err := e.openFlows(ctx, m, fwd, spec, sinkOf(e, scenario{target: sc.target})); err != nil {
				return rep{}, fmt.Errorf("open flows: %w", err)
			}
		}
		warm := traffic.RunOptions{Count: uint64(spec.Flows) * 8}
		if _, err := e.send(ctx, fwd, spec, sinkOf(e, scenario{target: sc.target}), warm, nil); err != nil {
			return rep{}, fmt.Errorf("warm-up: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
		if sc.traffic == trafficReply {
			tuples, err := m.replyTuples(ctx, e, int(sc.flows))
			if err != nil {
				return rep{}, fmt.Errorf("reply tuples: %w", err)
			}
			if len(tuples) == 0 {
				return rep{}, errors.New("no tracked flow to reply to")
			}
			spec = replySpec(e, tuples)
			s = e.replyGen
		}
	}
	observe := func() (*observation, error) { return m.observe(ctx, e) }
	return e.send(ctx, s, spec, sinkOf(e, sc), traffic.RunOptions{Count: sc.count, Duration: sc.duration}, observe)
}

// tracksHandshakes tells whether a mode needs an established scenario's
// flows opened by a handshake (openFlows) before its ACKs get through:
// xdplb does, as a segment without SYN and without state claims no SNAT
// port. The kernel's conntrack picks a TCP flow up from its ACKs
// (nf_conntrack_tcp_loose), and marks a handshake whose numbers the
// generator does not keep invalid, which kube-proxy drops.
func tracksHandshakes(m mode) bool {
	return m.name() == summary.ModeXDPLB || m.name() == summary.ModeXDPLBTC
}

// openFlows opens the flows of an established scenario as real clients
// and backends would before they are measured: a SYN each, then the
// backends' answers. The ACKs that follow (the warm-up) complete the
// handshakes. xdplb confirms a flow only once its backend answered; a UDP
// flow once answered and still active two seconds after it began.
func (e *env) openFlows(ctx context.Context, m mode, fwd sender, spec traffic.Spec, sink *traffic.Sink) error {
	syn := spec
	syn.TCPFlags = packet.SYN
	if _, err := e.send(ctx, fwd, syn, sink, traffic.RunOptions{Count: uint64(spec.Flows)}, nil); err != nil {
		return err
	}
	time.Sleep(50 * time.Millisecond)
	tuples, err := m.replyTuples(ctx, e, int(spec.Flows))
	if err != nil {
		return fmt.Errorf("reply tuples: %w", err)
	}
	if len(tuples) > 0 {
		answers := traffic.RunOptions{Count: uint64(len(tuples))}
		if _, err := e.send(ctx, e.replyGen, replySpec(e, tuples), sinkOf(e, scenario{traffic: trafficReply}), answers, nil); err != nil {
			return fmt.Errorf("answers: %w", err)
		}
	}
	if e.proto == traffic.UDP {
		time.Sleep(2100 * time.Millisecond)
	}
	return nil
}

// result aggregates the repetitions of a scenario into a report row: the
// median repetition by forwarded rate.
func (e *env) result(m mode, sc scenario, set ServiceSet, reps []rep) summary.Result {
	res := summary.Result{Mode: m.name(), Scenario: sc.id, Services: set.Count, Reps: len(reps)}
	if len(reps) == 0 {
		res.Error = "no repetition completed"
		return res
	}
	all := make([]float64, len(reps))
	for i, r := range reps {
		all[i] = r.mpps()
	}
	_, mid := summary.Median(all)
	r := reps[mid]
	res.AllMpps = all
	res.Sent, res.Arrived, res.Seconds = r.sent, r.arrived, r.elapsed.Seconds()
	res.Mpps = r.mpps()
	if r.elapsed > 0 {
		res.OfferedMpps = float64(r.sent) / r.elapsed.Seconds() / 1e6
	}
	if r.sent > 0 && r.arrived < r.sent {
		res.Loss = 1 - float64(r.arrived)/float64(r.sent)
	}
	if r.arrived > 0 {
		mpkts := float64(r.arrived) / 1e6
		res.CPUSecPerMpkt = r.pipelineCPU / mpkts
		res.MachineCPUSecPerMpkt = r.cpu.Busy() / mpkts
		if e.calibration > 0 && res.CPUSecPerMpkt > e.calibration {
			res.NodeCPUSecPerMpkt = res.CPUSecPerMpkt - e.calibration
		}
	}
	res.Flood = r.flood
	if sc.traffic == trafficNew {
		ex := detectExhaustion(r.timeline, r.sent, r.arrived, r.elapsed)
		if ex.Detected || sc.target == targetOne {
			res.Exhaustion = &ex
		}
	}
	if r.before != nil && r.after != nil {
		if r.after.counters != nil {
			res.Datapath = datapathDelta(r.before, r.after)
		}
		if k := r.after.kernel; k != nil {
			c := *k
			if b := r.before.kernel; b != nil {
				c.InsertFailed -= min(c.InsertFailed, b.InsertFailed)
				c.Drop -= min(c.Drop, b.Drop)
				c.EarlyDrop -= min(c.EarlyDrop, b.EarlyDrop)
			}
			res.Conntrack = &c
		}
	}
	return res
}

// datapathDelta turns two xdplb observations into the report's view.
func datapathDelta(before, after *observation) *summary.Datapath {
	d := &summary.Datapath{Counters: map[string]uint64{}, Drops: map[string]uint64{},
		ConntrackEntries: after.ctEntries, ConntrackCapacity: after.ctMax,
		NATEntries: after.natEnts, NATCapacity: after.natMax}
	for name, v := range after.counters {
		delta := v - min(v, before.counters[name])
		if delta == 0 {
			continue
		}
		d.Counters[name] = delta
		if strings.HasPrefix(name, "drop_") {
			d.Drops[name] = delta
		}
	}
	d.NewFlows = d.Counters["new_flow"]
	if grown := after.ctEntries - before.ctEntries; uint64(max(grown, 0)) < d.NewFlows {
		d.Evictions = d.NewFlows - uint64(max(grown, 0))
	}
	return d
}

// detectExhaustion finds the point where arrivals stopped while the
// generator kept sending: NAT source ports or conntrack room ran out. The
// run counts as exhausted when 98% of what arrived had arrived in the first
// 70% of the run and at least a sixth of what was sent got lost.
func detectExhaustion(timeline []sample, sent, arrived uint64, elapsed time.Duration) summary.Exhaustion {
	var ex summary.Exhaustion
	if arrived == 0 || len(timeline) < 3 || elapsed <= 0 {
		return ex
	}
	threshold := arrived * 98 / 100
	for _, s := range timeline {
		if s.arrived >= threshold && s.at > 0 {
			ex.ForwardedBefore = s.arrived
			ex.AfterSeconds = s.at.Seconds()
			ex.MppsBefore = float64(s.arrived) / s.at.Seconds() / 1e6
			break
		}
	}
	if ex.AfterSeconds == 0 {
		return ex
	}
	lostEnough := sent > 0 && arrived < sent*5/6
	ex.Detected = lostEnough && ex.AfterSeconds < 0.7*elapsed.Seconds()
	return ex
}
