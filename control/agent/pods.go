package agent

import (
	"context"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/loader"
)

// podPatterns splits --pod-interfaces into glob patterns.
func podPatterns(spec string) []string {
	var out []string
	for _, p := range strings.Split(spec, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// isPodInterface reports whether a name matches a pattern and is not one
// of the agent's NICs.
func (a *Agent) isPodInterface(name string) bool {
	if slices.Contains(a.cfg.Interfaces, name) {
		return false
	}
	for _, p := range podPatterns(a.cfg.PodInterfaces) {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// watchPods attaches the pod program to every pod interface as it
// appears (Start attached those there were), and forgets those that
// vanish. A netlink subscription can end under load (its socket buffer
// overflows when many interfaces come at once); then it subscribes again
// and catches up from a fresh list.
func (a *Agent) watchPods(ctx context.Context) {
	if len(podPatterns(a.cfg.PodInterfaces)) == 0 {
		// Pod interfaces are off: those an earlier agent attached go,
		// or they would run its programs on maps no pin names.
		a.forgetPinnedPods()
		a.podsDone()
		return
	}
	attached := a.attachedPods // name -> ifindex
	if attached == nil {
		attached = map[string]int{}
	}
	for {
		retry := time.Second
		if !a.watchPodsOnce(ctx, attached) {
			retry = 10 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// forgetPinnedPods detaches every pod interface the pins record (a pinned
// link, or a clsact mark).
func (a *Agent) forgetPinnedPods() {
	pinned, err := loader.PodInterfaces(a.cfg.Datapath.PinRoot)
	if err != nil {
		a.log.Warn("list pinned pod interfaces", "error", err)
		return
	}
	for _, name := range pinned {
		if err := a.dp.ForgetPod(name); err != nil {
			a.log.Warn("detach pod interface", "interface", name, "error", err)
			continue
		}
		a.log.Info("pod interface detached: pod interfaces are off", "interface", name)
	}
}

// attachPresentPods attaches the datapath to the pod interfaces there
// are, at the start: they run its programs before its pins are committed.
// An interface that fails is logged, as watchPods does.
func (a *Agent) attachPresentPods() {
	a.attachedPods = map[string]int{}
	if len(podPatterns(a.cfg.PodInterfaces)) == 0 {
		return
	}
	links, err := netlink.LinkList()
	if err != nil {
		a.log.Warn("list interfaces", "error", err)
		return
	}
	a.attachListedPods(links, a.attachedPods)
}

// podRetryEvery is how often watchPods tries again the pod interfaces
// whose attach failed (while they fail, their pods' traffic to services
// is not translated).
const podRetryEvery = 10 * time.Second

// attachListedPods attaches the pod interfaces among links that are not
// attached as they are now (by ifindex), and returns the names of all
// the links, and whether an attach failed.
func (a *Agent) attachListedPods(links []netlink.Link, attached map[string]int) (present map[string]bool, failed bool) {
	present = make(map[string]bool, len(links))
	for _, l := range links {
		name := l.Attrs().Name
		present[name] = true
		if a.isPodInterface(name) && !isBridge(l) && attached[name] != l.Attrs().Index {
			failed = !a.attachPod(name, l.Attrs().Index, attached) || failed
		}
	}
	return present, failed
}

// watchPodsOnce subscribes to link events, brings the attached set up to
// date from a full list, and follows events until the subscription or ctx
// ends; while an attach has failed, it lists the interfaces again every
// podRetryEvery and attaches those still not attached. It reports false
// when it could not subscribe.
func (a *Agent) watchPodsOnce(ctx context.Context, attached map[string]int) bool {
	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	defer close(done)
	// Subscribe before listing, so no interface falls between the two.
	err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) {
			if ctx.Err() == nil { // closing the subscription at shutdown reports EAGAIN
				a.log.Warn("pod interface watch", "error", err)
			}
		},
	})
	subscribed := err == nil
	if !subscribed {
		a.log.Warn("cannot watch interfaces; retrying, and attaching what is there meanwhile", "error", err)
	}

	links, listErr := netlink.LinkList()
	if listErr != nil {
		a.log.Warn("list interfaces", "error", listErr)
	}
	present, failed := a.attachListedPods(links, attached)
	// Pins of interfaces that went away while nobody watched (not when
	// the list failed: every pod interface would seem gone).
	if pinned, err := loader.PodInterfaces(a.cfg.Datapath.PinRoot); err == nil && listErr == nil {
		for _, name := range pinned {
			if !present[name] || !a.isPodInterface(name) {
				a.forgetPod(name, attached)
			}
		}
	}
	a.podsDone()
	if !subscribed {
		return false
	}
	retry := time.NewTicker(a.podRetryEvery)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return true
		case <-retry.C:
			if !failed {
				continue
			}
			links, err := netlink.LinkList()
			if err != nil {
				a.log.Warn("list interfaces", "error", err)
				continue
			}
			_, failed = a.attachListedPods(links, attached)
		case u, ok := <-updates:
			if !ok {
				if ctx.Err() == nil {
					a.log.Warn("pod interface watch ended; subscribing again")
				}
				return true
			}
			name := u.Attrs().Name
			if !a.isPodInterface(name) || isBridge(u.Link) {
				continue
			}
			switch u.Header.Type {
			case unix.RTM_NEWLINK:
				if attached[name] != int(u.Attrs().Index) && !a.attachPod(name, int(u.Attrs().Index), attached) {
					failed = true
				}
			case unix.RTM_DELLINK:
				a.forgetPod(name, attached)
			}
		}
	}
}

// podsDone records that the pod interfaces there were at the start carry
// this datapath's program, and asks for a sync, which reports the agent
// healthy.
func (a *Agent) podsDone() {
	a.podsListedOnce.Do(func() {
		close(a.podsListed)
		select {
		case a.trigger <- struct{}{}:
		default:
		}
	})
}

// podsAttached reports whether podsDone has run.
func (a *Agent) podsAttached() bool {
	select {
	case <-a.podsListed:
		return true
	default:
		return false
	}
}

// attachPod attaches a pod interface and records it; false when the
// attach failed (logged).
func (a *Agent) attachPod(name string, ifindex int, attached map[string]int) bool {
	if err := a.dp.AttachPod(name); err != nil {
		a.log.Warn("attach to pod interface", "interface", name, "error", err, "retry_every", a.podRetryEvery)
		return false
	}
	attached[name] = ifindex
	a.log.Info("pod interface attached", "interface", name)
	return true
}

func (a *Agent) forgetPod(name string, attached map[string]int) {
	if err := a.dp.ForgetPod(name); err != nil {
		a.log.Warn("forget pod interface", "interface", name, "error", err)
	}
	delete(attached, name)
	a.log.Debug("pod interface gone", "interface", name)
}

// isBridge tells a bridge (the pods' gateway in bridge-based CNIs) from a
// pod's own interface: traffic leaving pods is seen on their ports, not on
// the bridge, so the bridge is never attached even when a pattern matches.
func isBridge(l netlink.Link) bool {
	return l != nil && l.Type() == "bridge"
}
