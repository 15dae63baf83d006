// Package suite runs xdplb's perf suite: it builds what it needs (the
// xdplb binary, kube-proxy from the Go module proxy), sets up a sandbox of
// network namespaces, and measures each datapath mode on each scenario with
// bounded load, one mode at a time, all in one run so their ratios hold.
//
// Modes: baseline (an XDP program that only forwards: the machine's
// limit), xdplb with XDP, xdplb with XDP off (TC only), and the real
// kube-proxy in iptables, nftables and IPVS mode, running in the edge
// node against a real API server that holds the same Services. A mode
// that cannot run here is reported with the reason.
//
// Scenarios: established flows and new flows, to remote backends (SNAT)
// and to a local one, the replies of established flows, new flows into a
// nearly full conntrack, new flows to a single backend beyond its NAT
// ports, and new flows with 1, 1k, 10k (and 100k, xdplb only) Services.
package suite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/xdplb/xdplb/perf/summary"
	"github.com/xdplb/xdplb/perf/traffic"
	"github.com/xdplb/xdplb/tests/apiserver/k8sbin"
)

// Config is what to run.
type Config struct {
	Quick bool
	// OutDir receives report.{json,md,svg} and the logs.
	OutDir string
	// RepoRoot is the xdplb module's root (for building and for
	// perf/pktgen/pktgen.sh).
	RepoRoot string
	// XDPLB and KubeProxy are binaries to use instead of building them.
	XDPLB, KubeProxy string
	// Generator: "auto" (pktgen if the kernel has it), "bpf" or "pktgen".
	Generator string
	Threads   int
	FrameSize int
	Reps      int // repetitions per scenario (default 6, quick 1)
	// Rounds spreads the first step's repetitions over this many rounds
	// of every mode (default 3, quick 1).
	Rounds   int
	Backends int // endpoints of each target Service (default 16)
	// Services overrides the Service counts of the run.
	Services []int
	// Modes and Scenarios, if set, restrict the run to these names.
	Modes, Scenarios []string
	Log              *slog.Logger
}

// Run performs the run and returns its report (also written to
// cfg.OutDir). The error is for a run that could not happen at all;
// problems of single modes or scenarios are in the report.
func Run(ctx context.Context, cfg Config) (*summary.Report, error) {
	started := time.Now()
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the perf suite needs root (BPF, network namespaces)")
	}
	if cfg.Threads <= 0 {
		cfg.Threads = 1
	}
	if cfg.FrameSize == 0 {
		cfg.FrameSize = traffic.HeaderLen
	}
	if cfg.Reps <= 0 {
		cfg.Reps = 6
		if cfg.Quick {
			cfg.Reps = 1
		}
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 3
		if cfg.Quick {
			cfg.Rounds = 1
		}
	}
	if cfg.Backends <= 0 {
		cfg.Backends = 16
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("output directory: %w", err)
	}
	unlock, err := lockRun(ctx, log)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := removeStale(log); err != nil {
		return nil, fmt.Errorf("remove what an earlier run left: %w", err)
	}
	e := &env{log: log, dir: cfg.OutDir, threads: cfg.Threads, frameSize: cfg.FrameSize, proto: traffic.TCP,
		warmUp: !cfg.Quick}
	if e.softirqd, err = ksoftirqd(); err != nil {
		return nil, err
	}
	if _, e.controlCPUs, err = traffic.SplitCPUs(e.threads); err != nil {
		return nil, err
	}
	rpt := &summary.Report{Started: started, Quick: cfg.Quick}

	binDir, err := os.MkdirTemp("", "xdplb-perf-bin-")
	if err != nil {
		return nil, fmt.Errorf("build directory: %w", err)
	}
	defer os.RemoveAll(binDir)
	if e.xdplb, err = xdplbBinary(ctx, cfg, binDir, log); err != nil {
		return nil, err
	}
	kpErr := ""
	if e.kubeProxy, err = kubeProxyBinary(ctx, cfg, log); err != nil {
		log.Warn("kube-proxy unavailable", "err", err)
		kpErr = err.Error()
	}

	if e.topo, err = NewTopology(ctx); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	defer func() {
		if e.cluster != nil {
			if err := e.cluster.stop(); err != nil {
				log.Warn("stopping the API server", "err", err)
			}
		}
		for _, g := range []*traffic.Generator{e.gen, e.replyGen} {
			if g != nil {
				g.Close()
			}
		}
		if err := e.topo.Close(); err != nil {
			log.Warn("removing the sandbox", "err", err)
		}
		// Services files are large at scale and easy to regenerate.
		if files, err := filepath.Glob(filepath.Join(cfg.OutDir, "services-*.yaml")); err == nil {
			for _, f := range files {
				os.Remove(f)
			}
		}
	}()
	if _, err := exec.LookPath("nft"); err == nil {
		// What every mode must leave (nothing, in a new namespace).
		if e.netfilter, err = readNetfilter(e.topo.Edge); err != nil {
			return nil, fmt.Errorf("edge node's netfilter: %w", err)
		}
		if e.netfilter.ruleset != "" {
			log.Warn("the edge node starts with netfilter rules; every mode must leave them as they are", "tables", e.netfilter.tables)
		}
	}
	if e.gen, err = traffic.NewGenerator(e.topo.Gen, "eth0"); err != nil {
		return nil, err
	}
	if e.replyGen, err = traffic.NewGenerator(e.topo.Node2, "eth0"); err != nil {
		return nil, err
	}
	if err := e.choosePktgen(cfg); err != nil {
		return nil, err
	}

	rpt.Machine = machineFacts(e)
	if e.calibration, err = e.calibrate(ctx, cfg.Quick); err != nil {
		return nil, fmt.Errorf("calibration: %w", err)
	}
	rpt.Machine.Notes = measurementNotes(e)

	modes := []mode{
		&baselineMode{},
		&xdplbMode{},
		&xdplbMode{xdpOff: true},
		&kubeProxyMode{proxyMode: "iptables"},
		&kubeProxyMode{proxyMode: "nftables"},
		&kubeProxyMode{proxyMode: "ipvs"},
	}
	available := map[string]bool{}
	for _, m := range modes {
		info := summary.Mode{Name: m.name()}
		if len(cfg.Modes) > 0 && !slices.Contains(cfg.Modes, m.name()) {
			continue
		}
		why := m.unavailable(ctx, e)
		if why == "" && kpErr != "" && strings.HasPrefix(m.name(), "kube-proxy") {
			why = "kube-proxy could not be built: " + kpErr
		}
		info.Available, info.Reason = why == "", why
		available[m.name()] = info.Available
		rpt.Modes = append(rpt.Modes, info)
		if !info.Available {
			log.Info("mode unavailable", "mode", m.name(), "reason", why)
		}
	}
	for _, sc := range scenarios(cfg.Quick) {
		rpt.Scenarios = append(rpt.Scenarios, summary.Scenario{ID: sc.id, Title: sc.title})
	}

	steps := plan(cfg.Quick, cfg.Services, cfg.Backends)
	for i, st := range steps {
		if err := st.set.Validate(); err != nil {
			return nil, err
		}
		var scs []scenario
		for _, sc := range st.scenarios {
			if len(cfg.Scenarios) == 0 || slices.Contains(cfg.Scenarios, sc.id) {
				scs = append(scs, sc)
			}
		}
		var run []mode
		for _, m := range modes {
			// The baseline does not depend on Services: it runs once.
			if available[m.name()] && slices.Contains(st.modes, m.name()) && (i == 0 || m.name() != summary.ModeBaseline) {
				run = append(run, m)
			}
		}
		if len(scs) == 0 || len(run) == 0 {
			continue
		}
		// The first step holds most of the ratios: its repetitions are
		// spread over rounds, each starting every mode again (in
		// alternating order), so a noisy moment on a shared machine hits
		// all modes alike instead of one. Later steps run each mode once,
		// except where a target divides the step's figure by a 1-Service
		// one (referenceFor): that pair runs in rounds of its own.
		entries := make([]stepEntry, 0, len(run)+1)
		for _, m := range run {
			entries = append(entries, stepEntry{m: m, set: st.set, inRounds: i == 0})
			for _, sc := range scs {
				if !sc.appliesTo(m.name()) {
					continue
				}
				rpt.Scheduled = append(rpt.Scheduled, summary.Key{Mode: m.name(), Scenario: sc.id, Services: st.set.Count})
			}
		}
		if i > 0 {
			entries = addReference(entries, newServiceSet(1, st.set.Backends), scs)
		}
		rounds := 1
		if slices.ContainsFunc(entries, func(en stepEntry) bool { return en.inRounds }) {
			rounds = min(cfg.Rounds, cfg.Reps)
		}
		for k := range entries {
			entries[k].acc = &modeReps{reps: map[string][]rep{}, errs: map[string]error{}}
		}
	rounds:
		for r := 0; r < rounds; r++ {
			order := slices.Clone(entries)
			if r%2 == 1 {
				slices.Reverse(order)
			}
			perRound := cfg.Reps / rounds
			if r < cfg.Reps%rounds {
				perRound++
			}
			for _, en := range order {
				reps := cfg.Reps
				if en.inRounds {
					reps = perRound
				} else if r > 0 {
					continue
				}
				problems := e.runMode(ctx, en.m, en.set, en.scenarios(scs), reps, en.acc)
				rpt.Problems = append(rpt.Problems, problems...)
				if err := ctx.Err(); err != nil {
					rpt.Problems = append(rpt.Problems, "run interrupted: "+err.Error())
					break rounds
				}
			}
		}
		for _, en := range entries {
			for _, sc := range en.scenarios(scs) {
				res := e.result(en.m, sc, en.set, en.acc.reps[sc.id])
				if err := en.acc.errs[sc.id]; err != nil && (len(en.acc.reps[sc.id]) == 0 || en.acc.fatal[sc.id]) {
					res.Error = err.Error()
				}
				e.log.Info("result", "mode", en.m.name(), "scenario", sc.id, "services", en.set.Count, "reps", res.Reps,
					"mpps", summary.FormatMpps(res.Mpps), "loss", fmt.Sprintf("%.1f%%", 100*res.Loss), "notes", summary.Notes(res), "err", res.Error)
				if en.alongside != 0 {
					res.Alongside = en.alongside
					rpt.References = append(rpt.References, res)
					continue
				}
				rpt.Results = append(rpt.Results, res)
			}
		}
		for i := range rpt.Modes {
			for _, m := range modes {
				if m.name() == rpt.Modes[i].Name && rpt.Modes[i].Detail == "" && rpt.Modes[i].Available {
					rpt.Modes[i].Detail = m.detail()
				}
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(rpt.References) > 0 {
		rpt.Machine.Notes = append(rpt.Machine.Notes, fmt.Sprintf("The %s-Service step measures xdplb's %s figure at 1 Service again (References), in rounds alternating with its own xdplb figure; the scale target divides by that reference, not by the first step's figure, minutes apart.", summary.FormatServices(referenceFor), referenceScenario))
	}
	rpt.SortResults()
	rpt.ComputeTargets()
	rpt.Duration = time.Since(started).Seconds()
	if err := rpt.Write(cfg.OutDir); err != nil {
		return rpt, err
	}
	return rpt, nil
}

// stepEntry is one mode run of a step: a mode on a Service set.
type stepEntry struct {
	m   mode
	set ServiceSet
	// inRounds: its repetitions are spread over the step's rounds (else
	// it runs once, in the first).
	inRounds bool
	// alongside, for a reference figure, is the Service count of the step
	// (see addReference); it measures only referenceScenario.
	alongside int
	acc       *modeReps
}

func (en stepEntry) scenarios(scs []scenario) []scenario {
	if en.alongside == 0 {
		return scs
	}
	return pick(scs, referenceScenario)
}

// referenceFor is the step whose xdplb figure a target divides by
// xdplb's 1-Service figure, and referenceScenario the scenario. Taken
// minutes apart in different steps, that ratio moved by 0.7-1.3x with
// the machine's load while the datapath benchmark stayed flat, so the
// step measures its own 1-Service reference, in rounds alternating with
// its own figure.
const (
	referenceFor      = 10000
	referenceScenario = "new-remote"
)

// addReference adds the 1-Service reference run to a step that needs one,
// and puts xdplb's own run in rounds with it.
func addReference(entries []stepEntry, one ServiceSet, scs []scenario) []stepEntry {
	if len(pick(scs, referenceScenario)) == 0 {
		return entries
	}
	for k, en := range entries {
		if en.m.name() == summary.ModeXDPLB && en.set.Count == referenceFor {
			entries[k].inRounds = true
			// Right after its partner, in the first round too.
			return slices.Insert(entries, k+1, stepEntry{m: en.m, set: one, inRounds: true, alongside: en.set.Count})
		}
	}
	return entries
}

// modeReps collects a mode's repetitions of each scenario over rounds.
type modeReps struct {
	reps  map[string][]rep
	errs  map[string]error // the last error of each scenario
	fatal map[string]bool  // the error voids the scenario (the datapath died)
}

func (a *modeReps) fail(id string, err error, fatal bool) {
	a.errs[id] = err
	if fatal {
		if a.fatal == nil {
			a.fatal = map[string]bool{}
		}
		a.fatal[id] = true
	}
}

// runMode starts a mode, runs reps repetitions of each scenario into acc
// and stops the mode again. It returns problems that concern no single
// scenario.
func (e *env) runMode(ctx context.Context, m mode, set ServiceSet, scs []scenario, reps int, acc *modeReps) []string {
	var problems []string
	failAll := func(err error) []string {
		for _, sc := range scs {
			if !sc.appliesTo(m.name()) {
				continue
			}
			acc.fail(sc.id, err, true)
		}
		return problems
	}
	e.log.Info("mode", "mode", m.name(), "services", set.Count)
	if err := e.assertClean(); err != nil {
		return failAll(fmt.Errorf("the edge node is not clean before %s: %w", m.name(), err))
	}
	startErr := m.start(ctx, e, set)
	if startErr == nil {
		// Generous: kube-proxy in iptables mode takes a while to sync
		// many Services on a busy machine.
		timeout := 2*time.Minute + time.Duration(set.Count)*10*time.Millisecond
		startErr = waitForwarding(ctx, e, set, m.probeTargets(), timeout, m.alive)
	}
	defer func() {
		if err := m.stop(ctx, e); err != nil {
			problems = append(problems, fmt.Sprintf("%s: stop: %v", m.name(), err))
		}
		if err := e.assertClean(); err != nil {
			problems = append(problems, fmt.Sprintf("%s: left state behind: %v", m.name(), err))
		}
	}()
	if startErr != nil {
		e.log.Error("mode did not start", "mode", m.name(), "err", startErr)
		return failAll(fmt.Errorf("start: %w", startErr))
	}
	for _, sc := range scs {
		if err := ctx.Err(); err != nil {
			return failAll(err)
		}
		if !sc.appliesTo(m.name()) {
			continue
		}
		if err := m.prepare(ctx, e, sc); err != nil {
			acc.fail(sc.id, err, false)
			continue
		}
		if e.warmUp {
			if _, err := e.measure(ctx, m, sc, set); err != nil {
				e.log.Warn("warm-up repetition failed", "mode", m.name(), "scenario", sc.id, "err", err)
			}
		}
		for i := 0; i < reps; i++ {
			r, err := e.measure(ctx, m, sc, set)
			if err != nil {
				acc.fail(sc.id, err, false)
				e.log.Warn("repetition failed", "mode", m.name(), "scenario", sc.id, "err", err)
				if ctx.Err() != nil {
					break
				}
				continue
			}
			acc.reps[sc.id] = append(acc.reps[sc.id], r)
		}
		if err := m.alive(); err != nil {
			acc.fail(sc.id, err, true)
		}
		e.log.Debug("scenario done", "mode", m.name(), "scenario", sc.id, "reps", len(acc.reps[sc.id]))
	}
	return problems
}

// calibrate measures the CPU cost of the generator and a sink alone (the
// sink on the edge node's NIC, so no forwarding happens): the part of
// every figure that is not the node's.
func (e *env) calibrate(ctx context.Context, quick bool) (float64, error) {
	sink, err := traffic.NewSink(e.topo.Edge, "eth0")
	if err != nil {
		return 0, err
	}
	defer sink.Close()
	d, reps := time.Second, 3
	if quick {
		d, reps = 300*time.Millisecond, 1
	}
	spec := establishedSpec(e, scenario{target: targetRemote, flows: 16}, ServiceSet{Count: 1, Targets: 1, Backends: 1})
	var costs, rates []float64
	for i := 0; i < reps; i++ {
		r, err := e.send(ctx, e.forwardSender(), spec, sink, traffic.RunOptions{Count: 50_000_000, Duration: d}, nil)
		if err != nil {
			return 0, err
		}
		if r.arrived == 0 {
			return 0, errors.New("nothing arrived at the calibration sink")
		}
		costs = append(costs, r.pipelineCPU/(float64(r.arrived)/1e6))
		rates = append(rates, r.mpps())
	}
	cost, _ := summary.Median(costs)
	rate, _ := summary.Median(rates)
	e.log.Info("calibration: generator and sink alone", "mpps", summary.FormatMpps(rate), "cpu_s_per_mpkt", fmt.Sprintf("%.3f", cost))
	return cost, nil
}

func measurementNotes(e *env) []string {
	notes := []string{
		"Topology: network namespaces joined by veth pairs, no bridge: generator -> edge node eth0 (the datapath under test) -> eth1 -> node2 (sink for remote backends), vethpod0 -> a pod (sink for the local backend); replies come from node2 and are counted at the generator's side. Neighbours are static.",
		"Generator: xdp_gen in live-frames mode writes the whole Ethernet/IPv4/TCP header into every frame (pages come back as the forwarding path left them) and sends TCP SYNs (new flows) or ACKs (established flows); sinks are xdp_sink, counting per CPU and dropping.",
		"Forwarded Mpps: frames counted at the sink divided by the length of the run; loss: 1 - counted / sent. Each figure is the median of the repetitions.",
		fmt.Sprintf("CPU: seconds per million forwarded packets. On veth the node's and the sinks' receive processing runs in the sender's softirq on the sender's CPU, so the pipeline's CPU time is the generator threads' (RUSAGE_THREAD, which the kernel charges with that softirq work) plus ksoftirqd's, whatever else runs on the machine. The node's share subtracts the cost of the generator and a sink alone (%.3f CPU s/Mpkt in this run). The report's JSON also has the machine-wide busy time (/proc/stat), which includes other processes.", e.calibration),
		"Modes without their own XDP program (kube-proxy, xdplb-tc) get XDP_PASS on the edge node's NICs: a veth accepts XDP-transmitted frames only when it runs an XDP program. Physical NICs need no such thing.",
		fmt.Sprintf("xdplb runs with --conntrack-max %d (the kernel conntrack's limit here) and its default --snat-port-range %s; kube-proxy masquerades with ports 1024-65535.", conntrackMax, snatPortRange),
		"New-flow repetitions are bounded in count so no backend runs out of NAT ports (16 backends per target Service); conntrack is emptied between repetitions. Reaching a port limit is the snat-exhaust scenario's subject: one backend, 100k new flows.",
	}
	if len(e.controlCPUs) > 0 {
		notes = append(notes, fmt.Sprintf("The control plane (etcd, kube-apiserver, kube-proxy's and xdplb's agent processes) is bound to CPU %s, off the generator's CPU, where the packet path runs: on an edge node the API server is elsewhere. Unbound, they share that CPU with it (perf/README.md says what that cost).", joinInts(e.controlCPUs)))
	} else {
		notes = append(notes, "The control plane (etcd, kube-apiserver, kube-proxy's and xdplb's agent processes) shares the generator's CPUs: the generator takes them all.")
	}
	if e.warmUp {
		notes = append(notes, "Every start of a mode runs each scenario once unrecorded before its repetitions: fresh maps hand out entries in memory order, emptied ones in scattered order, as on a node that has run for a while (xdplb's first new-flow repetition after a start was 25-35% faster than the rest).")
	}
	return notes
}

// joinInts lists numbers separated by commas.
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// choosePktgen decides between pktgen and the BPF generator.
func (e *env) choosePktgen(cfg Config) error {
	switch cfg.Generator {
	case "", "auto", "pktgen":
		ok, why := traffic.PktgenAvailable(e.topo.Gen)
		if !ok {
			why = pktgenWhy(kernelConfig("CONFIG_NET_PKTGEN"), why)
			if cfg.Generator == "pktgen" {
				return errors.New("pktgen requested: " + why)
			}
			e.log.Info("using the BPF live-frames generator", "pktgen", why)
			e.noPktgen = why
			return nil
		}
		script := filepath.Join(cfg.RepoRoot, "perf", "pktgen", "pktgen.sh")
		e.pktgen = traffic.NewPktgen(e.topo.Gen, "eth0", script)
		e.proto = traffic.UDP // pktgen builds UDP only
		e.log.Info("using kernel pktgen; flows are UDP")
		return nil
	case "bpf":
		e.noPktgen = "-generator bpf chose the BPF generator"
		return nil
	}
	return fmt.Errorf("generator %q: want auto, bpf or pktgen", cfg.Generator)
}

// pktgenWhy says why pktgen is missing, from the kernel's CONFIG_NET_PKTGEN
// (y, m, n or "" when unknown) where that says more than the check did.
func pktgenWhy(config, checked string) string {
	switch config {
	case "n":
		return "pktgen is not built into this kernel (CONFIG_NET_PKTGEN is not set)"
	case "m":
		return "the pktgen module is not loaded (modprobe pktgen to use it)"
	}
	return checked
}

// xdplbBinary returns the xdplb binary to test, building it if needed.
func xdplbBinary(ctx context.Context, cfg Config, dir string, log *slog.Logger) (string, error) {
	if cfg.XDPLB != "" {
		return filepath.Abs(cfg.XDPLB)
	}
	out := filepath.Join(dir, "xdplb")
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, "./cmd/xdplb")
	cmd.Dir = cfg.RepoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build xdplb: %w\n%s", err, b)
	}
	log.Info("built xdplb", "path", out, "took", time.Since(start).Round(time.Millisecond))
	return out, nil
}

// kubeProxyBinary returns kube-proxy: the given one, the cached build, or
// a fresh build from the Go module proxy (minutes when cold). It also makes
// sure kube-apiserver and etcd are built.
func kubeProxyBinary(ctx context.Context, cfg Config, log *slog.Logger) (string, error) {
	if _, ok := k8sbin.Cached(); !ok {
		start := time.Now()
		log.Info("building kube-apiserver and etcd (cold: several minutes)")
		if _, err := k8sbin.Ensure(ctx); err != nil {
			return "", fmt.Errorf("build kube-apiserver/etcd: %w", err)
		}
		log.Info("built kube-apiserver and etcd", "took", time.Since(start).Round(time.Second))
	}
	if cfg.KubeProxy != "" {
		return filepath.Abs(cfg.KubeProxy)
	}
	if path, ok := k8sbin.CachedKubeProxy(); ok {
		return path, nil
	}
	start := time.Now()
	log.Info("building kube-proxy " + k8sbin.KubernetesVersion + " from the Go module proxy (cold: several minutes)")
	path, err := k8sbin.EnsureKubeProxy(ctx)
	if err != nil {
		return "", err
	}
	log.Info("built kube-proxy", "path", path, "took", time.Since(start).Round(time.Second))
	return path, nil
}
