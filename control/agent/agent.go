package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/health"
	"github.com/xdplb/xdplb/control/metrics"
	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/control/reconcile"
	"github.com/xdplb/xdplb/control/source"
	"github.com/xdplb/xdplb/loader"
)

// Agent is one running xdplb agent.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	dp      *loader.Datapath
	plane   *dataplane.Dataplane
	rec     *reconcile.Reconciler
	src     source.Source
	tracker *health.Tracker
	metrics *metrics.Metrics
	hcNodes *health.NodePortServers
	// purger purges the flows of removed backends, one purge at a time.
	purger *flowPurger

	trigger chan struct{}
	pending atomic.Int64

	// model keeps each Service's computed ports between syncs; needFull
	// asks the next sync to apply everything (first sync, after an error,
	// and periodically to repair drift).
	model    *model.Incremental
	needFull bool
	// healthzLn and metricsLn are the server addresses Start took.
	healthzLn, metricsLn net.Listener
	// nodeAddrs are the NodePort addresses of the last sync that could
	// read every interface it needed.
	nodeAddrs []netip.Addr

	// synced, when set (by tests and benchmarks), is told after every
	// successful sync which service ports it applied (nil: all).
	synced func(changed map[string]bool)

	started   time.Time
	syncs     uint64
	hintSweep hintSweep
	// spillCheckEvery paces trustSNATSpillMarks, which waits for
	// podsListed: closed (once) when watchPods has attached to the pod
	// interfaces there were at the start.
	spillCheckEvery time.Duration
	spillChecks     atomic.Uint64 // checks run, for tests
	podsListed      chan struct{}
	podsListedOnce  sync.Once
	lastTrigger     map[string]time.Time // service port key -> last-change-trigger-time observed
	// lock is held from Start until Run returns: one agent per pin root.
	lock         *loader.PinLock
	pidNamespace uint32 // of this process, recorded with its pid
	seenProblems map[string]bool
	// attachedPods are the pod interfaces attached (name -> ifindex):
	// Start attaches those there are, and watchPods keeps the set.
	attachedPods map[string]int
	// podRetryEvery paces watchPods' new attempts at pod interfaces
	// whose attach failed.
	podRetryEvery time.Duration
}

// Start loads and attaches the datapath and connects to the source. On
// an error before the datapath's pins are committed, nothing that this
// call attached stays attached, and what an earlier agent attached runs
// its programs on its maps as before (see start; the error says so when
// something could not be put back); after the commit (removing socket
// programs no longer wanted) the interfaces keep the new datapath. First
// of all it takes the lock on the pin root, which it holds until Run
// returns: a second agent on the same pins fails here, before it loads or
// attaches anything (a *loader.PinsInUseError).
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Agent, error) {
	lock, err := loader.LockPins(cfg.Datapath.PinRoot, log)
	if err != nil {
		return nil, err
	}
	a, err := start(cfg, log)
	if err != nil {
		lock.Unlock()
		return nil, err
	}
	a.lock = lock
	// This agent runs from now on; `xdplb status` calls it starting until
	// its first sync (which waits for the source) records more.
	if err := a.plane.PutAgentState(dataplane.AgentState{
		Started: a.started, PID: uint32(os.Getpid()), PIDNamespace: a.pidNamespace,
	}); err != nil {
		log.Warn("record agent state", "error", err)
	}
	return a, nil
}

// start is Start under the lock.
func start(cfg Config, log *slog.Logger) (*Agent, error) {
	src, err := newSource(cfg, log)
	if err != nil {
		return nil, err
	}
	// The server addresses are taken first: one in use (kube-proxy's, say,
	// on the same ports) ends the start before anything is attached.
	healthzLn, err := listen("healthz", cfg.HealthzAddress)
	if err != nil {
		return nil, err
	}
	metricsLn, err := listen("metrics", cfg.MetricsAddress)
	if err != nil {
		closeListener(healthzLn)
		return nil, err
	}
	closeListeners := func() {
		closeListener(healthzLn)
		closeListener(metricsLn)
	}
	if err := cfg.ProcSys.CheckSNATRange(cfg.Datapath.SNATPorts); err != nil {
		closeListeners()
		return nil, err
	}
	// An earlier agent's datapath still attached goes on translating to
	// SNAT ports, whatever becomes of this start.
	earlier := loader.DatapathAttached(cfg.Datapath.PinRoot)
	dp, err := loader.Load(cfg.Datapath, log)
	if err != nil {
		closeListeners()
		return nil, err
	}
	// Until the datapath's pins are committed, a failure puts back what
	// this start changed: every interface and the host's sockets run the
	// programs they ran, on the maps the pins still name (the next start
	// copies from those), with the configuration and the SNAT port
	// reservation those programs use. Interfaces this start attached
	// afresh are detached.
	var (
		reserved snatReservation
		fresh    []string
	)
	revert := func(err error) (*Agent, error) {
		if revertErr := revertAndClose(dp, fresh, log); revertErr != nil {
			err = fmt.Errorf("%w; and putting back what this start changed failed: %w", err, revertErr)
		}
		undo := reserved
		if !earlier {
			// No datapath is left to use the ports of the range given
			// back: they stay the host's.
			undo.released = portSet{}
		}
		if err := undoSNATReservation(cfg.Datapath.PinRoot, cfg.ProcSys, undo); err != nil {
			log.Warn("undo the SNAT port reservation", "error", err)
		}
		closeListeners()
		return nil, err
	}
	// After the load, which mounts the pin root: the reservation is
	// recorded there. Before the attach: no flow takes a SNAT port first.
	if reserved, err = reserveSNATPorts(cfg.Datapath.PinRoot, cfg.ProcSys, cfg.Datapath.SNATPorts, log); err != nil {
		return revert(err)
	}
	a, err := assemble(cfg, log, src, dp)
	if err != nil {
		return revert(err)
	}
	if fresh, err = attach(dp, cfg, log); err != nil {
		return revert(err)
	}
	a.attachPresentPods()
	switch {
	case cfg.CgroupRoot != "":
		if err := dp.AttachHostSockets(cfg.CgroupRoot); err != nil {
			return revert(err)
		}
		log.Info("host sockets reach services", "cgroup", cfg.CgroupRoot)
	case cfg.CgroupAuto:
		log.Warn("no cgroup v2 hierarchy found: the node's own processes will not reach services (see --cgroup-root)")
	}
	if err := dp.CommitPins(); err != nil {
		return revert(err)
	}

	// The pins name this datapath's maps from here on. What an earlier
	// agent attached that this one does not want goes only now: a start
	// that failed before left it running.
	detachUnlisted(dp, cfg, log)
	if cfg.CgroupRoot == "" {
		removed, err := dp.DetachHostSockets()
		if err != nil {
			// The pins are committed, so nothing is put back: the
			// interfaces keep this datapath and the SNAT reservation
			// stays; only the interfaces attached afresh go.
			detachFresh(dp, fresh, log)
			dp.Close()
			closeListeners()
			return nil, err
		}
		if removed > 0 {
			log.Info("detached the socket programs an earlier agent attached", "programs", removed)
		}
	}
	a.healthzLn, a.metricsLn = healthzLn, metricsLn
	return a, nil
}

// revertAndClose puts back what a failed start changed with a datapath
// whose pins are not committed (see loader.Datapath.Revert), detaching
// the interfaces it attached afresh, and closes the datapath. The error
// names the hooks it could not put back: they may run this datapath's
// programs on maps no pin names, until the next start replaces them.
func revertAndClose(dp *loader.Datapath, fresh []string, log *slog.Logger) error {
	detachFresh(dp, fresh, log)
	err := dp.Revert()
	dp.Close()
	return err
}

// listen takes a server's address; nil for an empty address (server off).
func listen(name, addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s server on %s: %w", name, addr, err)
	}
	return ln, nil
}

func closeListener(ln net.Listener) {
	if ln != nil {
		ln.Close()
	}
}

// assemble builds the agent around a loaded datapath and a source.
func assemble(cfg Config, log *slog.Logger, src source.Source, dp *loader.Datapath) (*Agent, error) {
	a := &Agent{
		cfg: cfg, log: log, src: src, dp: dp,
		plane:           dataplane.New(&dp.Maps),
		trigger:         make(chan struct{}, 1),
		started:         time.Now(),
		hintSweep:       newHintSweep(snatHintSweepEvery),
		spillCheckEvery: snatSpillCheckEvery,
		podRetryEvery:   podRetryEvery,
		podsListed:      make(chan struct{}),
		lastTrigger:     map[string]time.Time{},
		pidNamespace:    dataplane.PIDNamespaceOf("self"),
		seenProblems:    map[string]bool{},
		model:           model.NewIncremental(),
		needFull:        true,
	}
	var err error
	a.rec, err = reconcile.New(a.plane, reconcile.Config{
		MaglevMaxSize: cfg.MaglevTableSize,
		MaglevSeed:    cfg.MaglevSeed,
		ServicesMax:   cfg.Datapath.ServicesMax,
		BackendsMax:   cfg.Datapath.BackendsMax,
	}, log)
	if err != nil {
		return nil, err
	}
	a.tracker = health.NewTracker(cfg.HealthTimeout, cfg.NodeName, nil)
	a.metrics = metrics.New(a.plane, log)
	a.hcNodes = health.NewNodePortServers(a.tracker, "", log)
	a.purger = newFlowPurger(a.plane, log, func(ctx context.Context, dp *dataplane.Dataplane, s reconcile.Stale) (reconcile.Purged, error) {
		return reconcile.PurgeFlows(ctx, dp, s, a.rec.StillDeparted)
	})
	return a, nil
}

func newSource(cfg Config, log *slog.Logger) (source.Source, error) {
	if cfg.ServicesFile != "" {
		return source.NewFile(cfg.ServicesFile, log, source.WithProxyName(cfg.ProxyName)), nil
	}
	var restCfg *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		restCfg, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		restCfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	restCfg.UserAgent = "xdplb"
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return source.NewKubernetes(client, source.KubernetesOptions{
		NodeName: cfg.NodeName, ProxyName: cfg.ProxyName, ResyncPeriod: 0,
	}, log), nil
}

// attach attaches the datapath to every interface and returns those it
// attached afresh (also when one fails). Pinned links are first made to
// follow their interfaces through a rename or a deletion
// (loader.SettleNICPins; a failure there is logged, and an attach it
// leaves failing fails the start).
func attach(dp *loader.Datapath, cfg Config, log *slog.Logger) ([]string, error) {
	if err := dp.SettleNICPins(); err != nil {
		// What it could not settle fails below, naming the interface.
		log.Warn("could not match every pinned link to its interface", "error", err)
	}
	var fresh []string
	for _, ifname := range cfg.Interfaces {
		wasAttached := loader.NICAttached(cfg.Datapath.PinRoot, ifname)
		att, err := dp.AttachNIC(ifname, cfg.XDPMode)
		if !wasAttached {
			fresh = append(fresh, ifname)
		}
		if err != nil {
			return fresh, err
		}
		log.Info("datapath attached", "interface", att.Interface, "xdp_mode", att.Mode,
			"tc", att.TCMode, "xdp_prog_id", att.XDPProgID, "tc_prog_id", att.TCProgID)
		if att.Mode != loader.XDPOff {
			warnHiddenVLANs(ifname, log)
		}
	}
	warnMissingSNATAddrs(cfg, log)
	return fresh, nil
}

// warnMissingSNATAddrs warns about extra SNAT addresses none of the
// interfaces has (yet): no flow leaves with them until one gets them.
func warnMissingSNATAddrs(cfg Config, log *slog.Logger) {
	if cfg.Datapath.SNATExtraAddrs == ([loader.MaxSNATExtraAddrs]netip.Addr{}) {
		return
	}
	have, err := interfaceAddresses(cfg.Interfaces)
	if err != nil {
		log.Warn("cannot check the extra SNAT addresses", "error", err)
		return
	}
	for _, a := range cfg.Datapath.SNATExtraAddrs {
		if a.IsValid() && !slices.Contains(have, a) {
			log.Warn("extra SNAT address is on none of the interfaces: unused until one has it",
				"address", a, "interfaces", strings.Join(cfg.Interfaces, ","))
		}
	}
}

// warnHiddenVLANs warns when XDP on ifname sees its VLANs' frames
// untagged (loader.HiddenVLANs): it would serve them as frames of
// ifname's own network.
func warnHiddenVLANs(ifname string, log *slog.Logger) {
	vlans, err := loader.HiddenVLANs(ifname)
	switch {
	case err != nil:
		log.Debug("cannot check VLAN tag stripping", "interface", ifname, "error", err)
	case len(vlans) > 0:
		log.Warn("the NIC strips VLAN tags in hardware: XDP takes the frames of its VLANs for untagged ones; "+
			"run `ethtool -K "+ifname+" rxvlan off`, or attach to the VLAN devices instead",
			"interface", ifname, "vlans", vlans)
	}
}

// detachUnlisted detaches the interfaces an earlier agent attached that
// are no longer listed. A failure is logged: the listed ones run the
// datapath, and the SNAT spill marks stay untrusted while an old program
// runs elsewhere.
func detachUnlisted(dp *loader.Datapath, cfg Config, log *slog.Logger) {
	detached, err := dp.DetachNICsExcept(cfg.Interfaces)
	for _, name := range detached {
		log.Info("datapath detached from an interface no longer in --iface", "interface", name)
	}
	if err != nil {
		log.Warn("could not detach every interface no longer in --iface", "error", err)
	}
}

// detachFresh detaches the interfaces a failed start attached.
func detachFresh(dp *loader.Datapath, fresh []string, log *slog.Logger) {
	for _, name := range fresh {
		if err := dp.DetachNIC(name); err != nil {
			log.Warn("undo attach", "interface", name, "error", err)
		}
	}
}

// Close releases what Start took, for an agent that is not run: the
// datapath's handles, the server addresses and the lock on the pins. The
// datapath stays attached.
func (a *Agent) Close() {
	a.dp.Close()
	closeListener(a.healthzLn)
	closeListener(a.metricsLn)
	a.lock.Unlock()
}

// Run serves until ctx ends. The datapath stays attached afterwards.
func (a *Agent) Run(ctx context.Context) error {
	defer a.lock.Unlock() // last: the datapath is closed before
	defer a.dp.Close()
	defer a.hcNodes.Close()
	// Goroutines that use the maps end before they are closed.
	var mapUsers sync.WaitGroup
	defer mapUsers.Wait()
	defer a.purger.Stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	errc := make(chan error, 4)
	for _, srv := range []struct {
		name, addr string
		ln         net.Listener // taken by Start; nil: listen now
		handler    http.Handler
	}{
		{"healthz", a.cfg.HealthzAddress, a.healthzLn, a.tracker.Handler()},
		{"metrics", a.cfg.MetricsAddress, a.metricsLn, a.metrics.Handler()},
	} {
		ln := srv.ln
		if ln == nil {
			var err error
			if ln, err = listen(srv.name, srv.addr); err != nil {
				return err
			}
		}
		if ln != nil {
			a.serve(ctx, srv.name, ln, srv.handler, errc)
		}
	}
	go func() {
		if err := a.src.Run(ctx, a.notify); err != nil {
			errc <- fmt.Errorf("source: %w", err)
		}
	}()
	mapUsers.Go(func() { a.watchAddresses(ctx) })
	mapUsers.Go(func() { a.watchPods(ctx) })
	mapUsers.Go(func() { a.trustSNATSpillMarks(ctx) })
	mapUsers.Go(func() { a.watchRouting(ctx) })

	a.loop(ctx, errc)
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// notify records a change and wakes the sync loop.
func (a *Agent) notify() {
	a.pending.Add(1)
	a.metrics.PendingChanges.Set(float64(a.pending.Load()))
	a.tracker.Queued()
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// loop is the bounded-frequency sync loop: a burst of changes leads to one
// sync once MinSyncPeriod has passed since the previous one; a failed
// sync is retried with backoff; every SyncPeriod a full sync runs anyway.
func (a *Agent) loop(ctx context.Context, errc chan error) {
	var lastSync time.Time
	retry := time.Duration(0)
	var retryAt time.Time
	periodic := time.NewTicker(a.cfg.SyncPeriod)
	defer periodic.Stop()
	// The source's health is reported every second, not only when a sync
	// runs: an unreachable API server sends no events.
	health := time.NewTicker(time.Second)
	defer health.Stop()
	for {
		var wake <-chan time.Time
		if retry > 0 {
			wake = time.After(time.Until(retryAt))
		}
		select {
		case <-ctx.Done():
			return
		case err := <-errc:
			errc <- err
			return
		case <-health.C:
			a.reportSource(a.src.Status())
			continue
		case <-a.trigger:
		case <-periodic.C:
			a.needFull = true
		case <-wake:
		}
		if wait := a.cfg.MinSyncPeriod - time.Since(lastSync); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		// Drain a trigger that arrived meanwhile: this sync covers it.
		select {
		case <-a.trigger:
		default:
		}
		lastSync = time.Now()
		if err := a.sync(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			retry = min(max(2*retry, 100*time.Millisecond), 10*time.Second)
			retryAt = time.Now().Add(retry)
			a.log.Error("sync failed, retrying", "error", err, "retry_in", retry)
			a.metrics.Syncs.WithLabelValues("error").Inc()
			continue
		}
		retry = 0
	}
}

// retryRefused reports whether ports refused for lack of room should be
// tried again at once, by a full sync: the sync was incremental (a full
// one already fitted every port against the room its removals made) and
// it freed room they may fit in now.
func retryRefused(full bool, res reconcile.Result) bool {
	return !full && res.WaitingForRoom > 0 && res.FreedRoom()
}

// hintSweep decides when a sync clears the SNAT bucket hints of departed
// backends (dataplane.ReleaseSNATHints): at the first sync (pinned maps
// may keep hints of backends that left while no agent ran), and at the
// first sync at least an interval after a removal, once the purge of the
// removed backends' flows is done and their last flows have ended (a flow
// of a departed backend that ends in the datapath gives its triple a hint
// again). Stale hints only matter once many have piled up, so a sweep may
// wait.
type hintSweep struct {
	every   time.Duration
	pending bool
	since   time.Time // the first removal not swept yet; zero: the first sync
}

// newHintSweep returns a sweep due at the first sync.
func newHintSweep(every time.Duration) hintSweep { return hintSweep{every: every, pending: true} }

// due records a sync that removed `removed` backends and reports whether
// the sweep runs now.
func (h *hintSweep) due(removed int, now time.Time) bool {
	if removed > 0 && !h.pending {
		h.pending, h.since = true, now
	}
	if !h.pending || (!h.since.IsZero() && now.Sub(h.since) < h.every) {
		return false
	}
	h.pending = false
	return true
}

// retry makes the sweep due again at the next sync.
func (h *hintSweep) retry() { h.pending = true }

// snatHintSweepEvery is how long the agent waits after a removal before it
// sweeps SNAT bucket hints.
const snatHintSweepEvery = time.Minute

// releaseAfterTables is the number of tables written by one sync after
// which the agent hands freed memory back to the OS.
const releaseAfterTables = 1000

// sync computes the desired state from the source and applies it.
func (a *Agent) sync(ctx context.Context) error {
	st := a.src.Status()
	a.reportSource(st)
	if !st.Synced {
		return nil // nothing complete to program yet; keep what is pinned
	}
	start := time.Now()
	pending := a.pending.Swap(0)
	snap := a.src.Snapshot()
	node := model.NodeInfo{Name: a.cfg.NodeName, Addresses: a.nodeAddresses(snap), Zone: nodeZone(snap),
		ProxyName: a.cfg.ProxyName}
	state, problems, changed := a.model.Update(model.Input{Services: snap.Services, Slices: snap.Slices, Node: node})
	state = a.filterNodePorts(state, &problems)

	var res reconcile.Result
	var err error
	full := a.needFull
	if full {
		changed = nil
		res, err = a.rec.Apply(ctx, state)
	} else {
		ports := make(map[string]*model.Service, len(changed))
		for k := range changed {
			if p := a.model.Port(k); p != nil {
				s := *p
				a.filterPort(&s, nil) // reported with the whole state above
				ports[k] = &s
			} else {
				ports[k] = nil
			}
		}
		res, err = a.rec.ApplyChanges(ctx, ports)
	}
	if err != nil {
		a.pending.Add(pending)
		a.needFull = true
		// What the failed Apply freed or saw leave is stale all the
		// same: the retry does not see those changes again.
		a.purger.Add(res.Stale())
		return err
	}
	a.needFull = false
	if retryRefused(full, res) {
		// Room freed for ports refused earlier: only a full sync tries
		// ports that did not change, so run one now, not at the period.
		a.needFull = true
		select {
		case a.trigger <- struct{}{}:
		default:
		}
	}
	elapsed := time.Since(start)
	a.metrics.SyncDuration.Observe(elapsed.Seconds())
	if res.MaglevBuilds > 0 {
		a.metrics.MaglevBuildDuration.Observe(res.MaglevTime.Seconds())
	}
	a.metrics.Syncs.WithLabelValues("ok").Inc()
	a.metrics.LastSync.SetToCurrentTime()
	a.metrics.ServicePorts.Set(float64(res.ServicePorts))
	a.metrics.PendingChanges.Set(float64(a.pending.Load()))
	a.observeProgramming(state, changed, res.ProblemPorts)
	// Everything queued before start is applied. Healthy only once the
	// first pass over the pod interfaces is done (a pod's traffic to a
	// service bypasses the datapath until its interface has the pod
	// program; a pass that could not list the interfaces counts as done);
	// podsDone triggers a sync.
	if a.podsAttached() {
		a.tracker.Updated(start)
	}

	all := make([]string, 0, len(problems)+len(res.Problems))
	for _, p := range problems {
		all = append(all, p.String())
	}
	all = append(all, res.Problems...)
	a.metrics.Problems.Set(float64(len(all)))
	a.logProblems(all)

	if res.Changed() {
		a.log.Info("datapath synced", "service_ports", res.ServicePorts, "duration", elapsed,
			"backends_added", res.BackendsAdded, "backends_removed", res.BackendsRemoved,
			"tables_written", res.TablesWritten, "tables_removed", res.TablesRemoved,
			"frontends_written", res.FrontendsWritten, "frontends_removed", res.FrontendsRemoved,
			"maglev_builds", res.MaglevBuilds)
	} else {
		a.log.Debug("datapath in sync", "service_ports", res.ServicePorts, "duration", elapsed)
	}
	stale := res.Stale()
	// The first sync has no earlier records: check every flow and
	// affinity entry an earlier agent left against the ones it wrote.
	stale.Sweep = a.syncs == 0
	a.purger.Add(stale)
	if a.hintSweep.due(len(res.RemovedBackends), time.Now()) {
		if err := a.releaseSNATHints(); err != nil {
			a.log.Warn("release SNAT bucket hints of departed backends; retrying at the next sync", "error", err)
			a.hintSweep.retry()
		}
	}
	a.syncHealthCheckNodePorts(state)
	if res.TablesWritten >= releaseAfterTables {
		// A sync that wrote this many tables (the first one, mostly) left
		// garbage several times the agent's live memory; collect it and
		// return it to the OS now rather than keep it resident until the
		// heap grows back to that size.
		go debug.FreeOSMemory()
	}

	a.syncs++
	if a.synced != nil {
		a.synced(changed)
	}
	if err := a.plane.PutAgentState(dataplane.AgentState{
		LastSync: time.Now(), Started: a.started, Syncs: a.syncs,
		PID: uint32(os.Getpid()), PIDNamespace: a.pidNamespace,
		ServicePorts: uint32(res.ServicePorts), Problems: uint32(len(all)),
	}); err != nil {
		a.log.Warn("record agent state", "error", err)
	}
	return nil
}

func (a *Agent) reportSource(st source.Status) {
	if st.Err != nil {
		a.tracker.SourceError(st.Err.Error(), st.ErrSince)
		a.metrics.SourceStale.Set(1)
		return
	}
	a.tracker.SourceError("", time.Time{})
	a.metrics.SourceStale.Set(0)
}

// logProblems logs problems when they first appear and when they clear.
func (a *Agent) logProblems(problems []string) {
	now := map[string]bool{}
	for _, p := range problems {
		now[p] = true
		if !a.seenProblems[p] {
			a.log.Warn("skipped", "problem", p)
		}
	}
	for p := range a.seenProblems {
		if !now[p] {
			a.log.Info("resolved", "problem", p)
		}
	}
	a.seenProblems = now
}

// observeProgramming records, for every service port whose endpoints
// changed in this sync (changed: their keys, nil for all), how long ago the
// change was triggered. A port the sync could not program fully
// (problemPorts: Result.ProblemPorts) is not observed yet: its change counts from its
// trigger until a sync programs it.
func (a *Agent) observeProgramming(state model.State, changed, problemPorts map[string]bool) {
	observe := func(key string, s *model.Service) {
		if s == nil {
			delete(a.lastTrigger, key)
			return
		}
		if problemPorts[key] {
			return
		}
		t := s.LastChangeTriggerTime
		prev, known := a.lastTrigger[key]
		a.lastTrigger[key] = t
		if !t.IsZero() && t.After(prev) && (known || a.syncs > 0) {
			a.metrics.ProgrammingDuration.Observe(time.Since(t).Seconds())
		}
	}
	if changed == nil {
		seen := make(map[string]bool, len(state.Services))
		for i := range state.Services {
			key := state.Services[i].Key()
			seen[key] = true
			observe(key, &state.Services[i])
		}
		// Ports removed since the last sync.
		for key := range a.lastTrigger {
			if !seen[key] {
				delete(a.lastTrigger, key)
			}
		}
		return
	}
	for k := range changed {
		observe(k, a.model.Port(k))
	}
}

func (a *Agent) syncHealthCheckNodePorts(state model.State) {
	want := healthCheckNodePorts(state)
	if err := a.hcNodes.Sync(want); err != nil {
		a.log.Warn("health check node ports", "error", err)
	}
}

// healthCheckNodePorts lists what each healthCheckNodePort answers: the
// number of this node's ready endpoints of its Service, distinct addresses
// over all its ports, as kube-proxy counts them. Terminating endpoints do
// not count, so that a load balancer drains a node whose pods are all going
// away (they still serve its established flows).
func healthCheckNodePorts(state model.State) []health.ServiceHealth {
	byPort := map[uint16]health.ServiceHealth{}
	ready := map[uint16]map[netip.Addr]bool{}
	for i := range state.Services {
		s := &state.Services[i]
		port := s.HealthCheckNodePort
		if port == 0 {
			continue
		}
		byPort[port] = health.ServiceHealth{Namespace: s.Namespace, Name: s.Name, Port: port}
		if ready[port] == nil {
			ready[port] = map[netip.Addr]bool{}
		}
		for _, e := range s.Endpoints {
			if e.Local && e.Ready {
				ready[port][e.Addr] = true
			}
		}
	}
	out := make([]health.ServiceHealth, 0, len(byPort))
	for port, h := range byPort {
		h.LocalEndpoints = len(ready[port])
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b health.ServiceHealth) int { return int(a.Port) - int(b.Port) })
	return out
}

// filterNodePorts drops NodePort frontends outside the node port range.
// The state belongs to the model, which keeps it between syncs, so the
// services are copied before the first one changes.
func (a *Agent) filterNodePorts(st model.State, problems *[]model.Problem) model.State {
	copied := false
	for i := range st.Services {
		if !slices.ContainsFunc(st.Services[i].Frontends, a.outsideNodePortRange) {
			continue
		}
		if !copied {
			st.Services = slices.Clone(st.Services)
			copied = true
		}
		a.filterPort(&st.Services[i], problems)
	}
	return st
}

// outsideNodePortRange reports whether f is a NodePort frontend outside
// --nodeport-range.
func (a *Agent) outsideNodePortRange(f model.Frontend) bool {
	return f.Kind == model.NodePort && (f.Port < a.cfg.NodePortMin || f.Port > a.cfg.NodePortMax)
}

// filterPort drops the NodePort frontends of s outside the node port
// range, reporting each to problems when it is not nil.
// It gives s a new frontend slice: the old one may be the model's.
func (a *Agent) filterPort(s *model.Service, problems *[]model.Problem) {
	if !slices.ContainsFunc(s.Frontends, a.outsideNodePortRange) {
		return
	}
	kept := make([]model.Frontend, 0, len(s.Frontends))
	for _, f := range s.Frontends {
		if !a.outsideNodePortRange(f) {
			kept = append(kept, f)
			continue
		}
		if problems != nil {
			*problems = append(*problems, model.Problem{Kind: "Service", Object: s.Namespace + "/" + s.Name,
				Field: "spec.ports[].nodePort", Message: fmt.Sprintf("node port %d outside --nodeport-range %d-%d",
					f.Port, a.cfg.NodePortMin, a.cfg.NodePortMax)})
		}
	}
	s.Frontends = kept
}

// nodeAddresses are the addresses that get NodePort frontends. When an
// interface cannot be read, the last complete list stands: a transient
// netlink failure must not withdraw NodePorts (and rebuild every port).
func (a *Agent) nodeAddresses(snap source.Snapshot) []netip.Addr {
	addrs, err := listNodeAddresses(a.cfg, snap)
	if err != nil && a.nodeAddrs != nil {
		a.log.Warn("node addresses: keeping the last complete list", "error", err, "addresses", a.nodeAddrs)
		return a.nodeAddrs
	}
	if err == nil {
		a.nodeAddrs = addrs
	}
	return addrs
}

// nodeZone is this node's topology.kubernetes.io/zone label, "" when the
// Node is not known (services-file mode, or not seen yet) or has none.
func nodeZone(snap source.Snapshot) string {
	if snap.Node == nil {
		return ""
	}
	return snap.Node.Labels[corev1.LabelTopologyZone]
}

// releaseSNATHints clears the SNAT bucket hints no current backend can use.
func (a *Agent) releaseSNATHints() error {
	// Every address of the attached interfaces: the datapath knows one per
	// interface (its SNAT source), and SNAT flows keep the one they started
	// with when that changes, while the interface still has it.
	addrs, err := interfaceAddresses(a.cfg.Interfaces)
	if err != nil {
		return err
	}
	n, err := a.plane.ReleaseSNATHints(a.rec.Backends(), addrs)
	if err != nil {
		return err
	}
	if n > 0 {
		a.log.Info("SNAT bucket hints of departed backends released", "hints", n)
	}
	return nil
}

// serve runs an HTTP server until ctx ends.
func (a *Agent) serve(ctx context.Context, name string, ln net.Listener, h http.Handler, errc chan error) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("%s server: %w", name, err)
		}
	}()
	a.log.Info("serving", "endpoint", name, "address", ln.Addr().String())
}
