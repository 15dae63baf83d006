package agent

import (
	"context"
	"log/slog"
	"time"

	"github.com/vishvananda/netlink"
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
