package agent

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
)

// The address watch outlives its subscriptions: one that ends (the
// netlink socket overflowed) or cannot be made is made again, and each
// new one counts as a change, for what changed while nothing watched.
// IPv6 changes are not the datapath's.
func TestAddressWatchSubscribesAgain(t *testing.T) {
	v4 := netlink.AddrUpdate{LinkAddress: net.IPNet{IP: net.IPv4(192, 0, 2, 1), Mask: net.CIDRMask(24, 32)}}
	v6 := netlink.AddrUpdate{LinkAddress: net.IPNet{IP: net.ParseIP("2001:db8::1"), Mask: net.CIDRMask(64, 128)}}
	for _, tc := range []struct {
		name  string
		first func(updates chan<- netlink.AddrUpdate) error // the first subscription
		// changes reported before the second subscription is made:
		// its own start, and any update of the first.
		wantChanges int32
	}{
		{"ended after an IPv4 and an IPv6 change", func(updates chan<- netlink.AddrUpdate) error {
			updates <- v4
			updates <- v6
			close(updates)
			return nil
		}, 2},
		{"could not be made", func(chan<- netlink.AddrUpdate) error {
			return errors.New("no netlink socket")
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var changes, atSecond atomic.Int32
			second := make(chan struct{})
			subscriptions := 0
			w := addressWatch{
				subscribe: func(updates chan<- netlink.AddrUpdate, done <-chan struct{}) error {
					subscriptions++
					if subscriptions == 1 {
						return tc.first(updates)
					}
					if subscriptions == 2 {
						atSecond.Store(changes.Load())
						close(second)
					}
					return nil // open until done
				},
				changed:          func() { changes.Add(1) },
				log:              discard(),
				resubscribeAfter: time.Millisecond,
				retryAfter:       time.Millisecond,
			}
			ended := make(chan struct{})
			go func() {
				w.run(ctx)
				close(ended)
			}()
			select {
			case <-second:
			case <-time.After(10 * time.Second):
				t.Fatal("no second subscription")
			}
			if got := atSecond.Load(); got != tc.wantChanges {
				t.Errorf("%d changes before the second subscription, want %d", got, tc.wantChanges)
			}
			// The second subscription's start is a change too.
			deadline := time.Now().Add(10 * time.Second)
			for changes.Load() != tc.wantChanges+1 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if got := changes.Load(); got != tc.wantChanges+1 {
				t.Errorf("%d changes after the second subscription started, want %d", got, tc.wantChanges+1)
			}
			cancel()
			select {
			case <-ended:
			case <-time.After(10 * time.Second):
				t.Fatal("the watch did not end with its context")
			}
		})
	}
}

// "--nodeport-addresses primary" takes the Node's primary address as
// kube-proxy does: its first IPv4 InternalIP, else its first IPv4
// ExternalIP.
func TestPrimaryNodeIP(t *testing.T) {
	addr := func(kind corev1.NodeAddressType, ip string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: kind, Address: ip}
	}
	for _, tc := range []struct {
		name  string
		addrs []corev1.NodeAddress
		want  string // "" for none
	}{
		{"internal first", []corev1.NodeAddress{addr(corev1.NodeExternalIP, "203.0.113.5"), addr(corev1.NodeInternalIP, "10.0.0.5")}, "10.0.0.5"},
		{"external when no internal", []corev1.NodeAddress{addr(corev1.NodeHostName, "edge-1"), addr(corev1.NodeExternalIP, "203.0.113.5")}, "203.0.113.5"},
		{"IPv4 only", []corev1.NodeAddress{addr(corev1.NodeInternalIP, "fd00::5"), addr(corev1.NodeExternalIP, "203.0.113.5")}, "203.0.113.5"},
		{"none", []corev1.NodeAddress{addr(corev1.NodeHostName, "edge-1")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{Status: corev1.NodeStatus{Addresses: tc.addrs}}
			ip, ok := primaryNodeIP(node)
			if got := ip.String(); !ok && tc.want != "" || ok && got != tc.want {
				t.Errorf("primaryNodeIP = %s, %v; want %q", got, ok, tc.want)
			}
		})
	}
}
