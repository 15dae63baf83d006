package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	"github.com/xdplb/xdplb/control/source"
)

// addressSubscriber subscribes to the node's address changes, as
// netlink.AddrSubscribeWithOptions does: updates until done is closed,
// or until the subscription fails (updates is closed then).
type addressSubscriber func(updates chan<- netlink.AddrUpdate, done <-chan struct{}) error

// watchAddresses re-syncs when the node's addresses change, and keeps the
// SNAT address of each attached interface current.
func (a *Agent) watchAddresses(ctx context.Context) {
	subscribe := func(updates chan<- netlink.AddrUpdate, done <-chan struct{}) error {
		return netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{
			ErrorCallback: func(err error) {
				if ctx.Err() == nil { // closing the subscription at shutdown reports EAGAIN
					a.log.Warn("address watch", "error", err)
				}
			},
		})
	}
	w := addressWatch{subscribe: subscribe, changed: a.addressesChanged, log: a.log,
		resubscribeAfter: time.Second, retryAfter: 10 * time.Second}
	w.run(ctx)
}

// addressesChanged re-reads the SNAT address of every attached interface
// and asks for a sync (NodePort frontends follow the node's addresses).
func (a *Agent) addressesChanged() {
	for _, ifname := range a.cfg.Interfaces {
		if err := a.dp.RefreshInterface(ifname); err != nil {
			a.log.Warn("refresh interface address", "interface", ifname, "error", err)
		}
	}
	a.notify()
}

// An addressWatch calls changed for every IPv4 address change. A
// subscription ends when its socket overflows (ENOBUFS: changes were
// lost); another is made resubscribeAfter later, or retryAfter after one
// that could not be made. Each subscription calls changed once when it
// starts, for what changed while nothing watched.
type addressWatch struct {
	subscribe                    addressSubscriber
	changed                      func()
	log                          *slog.Logger
	resubscribeAfter, retryAfter time.Duration
}

// run watches until ctx ends.
func (w addressWatch) run(ctx context.Context) {
	for {
		wait := w.resubscribeAfter
		if err := w.follow(ctx); err != nil {
			wait = w.retryAfter
			w.log.Warn("cannot watch address changes; trying again", "after", wait, "error", err)
		} else if ctx.Err() == nil {
			w.log.Warn("address watch ended; watching again", "after", wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// follow follows one subscription until it or ctx ends; an error when
// none could be made.
func (w addressWatch) follow(ctx context.Context) error {
	updates := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := w.subscribe(updates, done); err != nil {
		return err
	}
	w.changed()
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-updates:
			if !ok {
				return nil
			}
			if u.LinkAddress.IP.To4() != nil {
				w.changed()
			}
		}
	}
}

// primaryNodeIP is the Node's primary IPv4 address as kube-proxy takes it:
// its first IPv4 InternalIP, else its first IPv4 ExternalIP.
func primaryNodeIP(node *corev1.Node) (netip.Addr, bool) {
	if node == nil {
		return netip.Addr{}, false
	}
	for _, kind := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, na := range node.Status.Addresses {
			if na.Type != kind {
				continue
			}
			if ip, err := netip.ParseAddr(na.Address); err == nil && ip.Is4() {
				return ip, true
			}
		}
	}
	return netip.Addr{}, false
}

// listNodeAddresses lists the NodePort addresses cfg asks for; the error
// says which interfaces could not be read (the others' addresses are
// listed all the same).
func listNodeAddresses(cfg Config, snap source.Snapshot) ([]netip.Addr, error) {
	var out []netip.Addr
	var err error
	switch {
	case cfg.NodePortPrimary:
		if ip, ok := primaryNodeIP(snap.Node); ok {
			return []netip.Addr{ip}, nil
		}
		var addrs []netip.Addr
		if addrs, err = interfaceAddresses(cfg.Interfaces[:1]); len(addrs) > 0 {
			return addrs[:1], nil
		}
	case len(cfg.NodePortAddresses) > 0:
		var all []netip.Addr
		all, err = interfaceAddresses(nil)
		for _, ip := range all {
			for _, p := range cfg.NodePortAddresses {
				if p.Contains(ip) {
					out = append(out, ip)
					break
				}
			}
		}
	default:
		out, err = interfaceAddresses(cfg.Interfaces)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return slices.Compact(out), err
}

// interfaceAddresses lists the IPv4 addresses of the named interfaces (all
// interfaces when names is nil). The error says which could not be read;
// the addresses of the others are returned all the same.
func interfaceAddresses(names []string) ([]netip.Addr, error) {
	var links []netlink.Link
	var errs []error
	if names == nil {
		var err error
		if links, err = netlink.LinkList(); err != nil {
			errs = append(errs, fmt.Errorf("list interfaces: %w", err))
		}
	} else {
		for _, n := range names {
			l, err := netlink.LinkByName(n)
			if err != nil {
				errs = append(errs, fmt.Errorf("interface %s: %w", n, err))
				continue
			}
			links = append(links, l)
		}
	}
	var out []netip.Addr
	for _, l := range links {
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			errs = append(errs, fmt.Errorf("interface %s: list addresses: %w", l.Attrs().Name, err))
			continue
		}
		for _, ad := range addrs {
			if ip, ok := netip.AddrFromSlice(ad.IP.To4()); ok && !ip.IsLoopback() {
				out = append(out, ip)
			}
		}
	}
	return out, errors.Join(errs...)
}
