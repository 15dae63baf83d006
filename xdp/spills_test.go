package xdp_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/xdp"
)

// Spills are SNAT reply tuples kept in the nat map although they have a
// slot (see struct snat_slot in include/structs.h). A claim looks a port up in
// the nat map only when its slot is marked as spilled into, once the
// agent has found every spill marked.

// snatSlotOf returns the bucket and slot index of a reply tuple from
// backend to natAddr:port.
func snatSlotOf(t *testing.T, f *fixture, backend netip.AddrPort, natAddr netip.Addr, port uint16) (bucket, index uint32) {
	t.Helper()
	opts := f.dp.Options()
	var hint uint32
	if err := f.dp.Maps.SNATBucketHints.Lookup(xdp.SNATHint(backend, natAddr, packet.TCP), &hint); err != nil {
		t.Fatal(err)
	}
	bucket, ok := xdp.SNATHintBucket(hint, opts.SNATBuckets())
	if !ok {
		t.Fatalf("backend %s has no SNAT bucket", backend)
	}
	return bucket, xdp.SNATSlot(bucket, port, opts.SNATPorts)
}

func (f *fixture) snatSlot(index uint32) xdp.SnatSlot {
	f.t.Helper()
	var slot xdp.SnatSlot
	if err := f.dp.Maps.SNATSlots.Lookup(index, &slot); err != nil {
		f.t.Fatal(err)
	}
	return slot
}

// offerNext makes a bucket's hand offer port next, and ends any rest.
func (f *fixture) offerNext(bucket uint32, port uint16) {
	f.t.Helper()
	offset, _ := f.dp.Options().SNATPorts.Offset(port)
	hand := xdp.SnatBucketHand{Next: offset}
	if err := f.dp.Maps.SNATBucketHands.Put(bucket, hand); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) setSpillsMarked(marked bool) {
	f.t.Helper()
	var cfg xdp.DatapathConfig
	if err := f.dp.Maps.Config.Lookup(uint32(0), &cfg); err != nil {
		f.t.Fatal(err)
	}
	cfg.SnatSpillsMarked = 0
	if marked {
		cfg.SnatSpillsMarked = 1
	}
	if err := f.dp.Maps.Config.Put(uint32(0), cfg); err != nil {
		f.t.Fatal(err)
	}
}

// spill moves a SNAT flow's reverse half from its slot into the nat map,
// as an older datapath that did not mark spills could have left it, and
// returns its reply tuple.
func (f *fixture) spill(flow dataplane.Flow) xdp.NatKey {
	f.t.Helper()
	var rev xdp.NatEntry
	if found, err := f.maps.UpdateReverse(flow, func(e *xdp.NatEntry) { rev = *e }); err != nil || !found {
		f.t.Fatalf("flow %+v has no reverse half: %v", flow, err)
	}
	if err := f.maps.DeleteReverse(flow); err != nil {
		f.t.Fatal(err)
	}
	rk := xdp.NatKey{Saddr: xdp.AddrToNet(flow.Backend.Addr()), Sport: xdp.PortToNet(flow.Backend.Port()),
		Daddr: xdp.AddrToNet(flow.NAT.Addr()), Dport: xdp.PortToNet(flow.NAT.Port()), Proto: flow.Proto}
	if err := f.dp.Maps.NAT.Put(rk, rev); err != nil {
		f.t.Fatal(err)
	}
	return rk
}

// A backend sharing a bucket spills its flow into the nat map and marks
// the slot; when that slot is free again, the backend's next flow is not
// given the port its live spilled flow holds.
func TestSpillMarksItsSlot(t *testing.T) {
	const ports = 32
	f, two := sharedBucketFixture(t, ports)
	frame := tcpFrame(clientAddr, 0, nodeAddr, 30100, packet.SYN, "")
	toFirst, toSecond := sharedBucketClients(two, ports, 3)
	for _, c := range toFirst[:ports] {
		frame.SrcPort = c
		f.expectVerdict(f.run(frame.Bytes(), f.nic0), xdpRedirect)
	}
	frame.SrcPort = toSecond[0]
	sent := decode(t, f.run(frame.Bytes(), f.nic0).out)
	second := netip.AddrPortFrom(remotePod2, podPort)
	bucket, index := snatSlotOf(t, f, second, sent.Src, sent.SrcPort)
	slot := f.snatSlot(index)
	if slot.Flags&uint32(xdp.SnatSlotFlagsSNAT_SLOT_SPILLED) == 0 {
		t.Fatalf("slot of spilled port %d has flags %#x, want it marked", sent.SrcPort, slot.Flags)
	}
	spilled := xdp.NatKey{Saddr: xdp.AddrToNet(remotePod2), Sport: xdp.PortToNet(podPort),
		Daddr: xdp.AddrToNet(sent.Src), Dport: xdp.PortToNet(sent.SrcPort), Proto: packet.TCP}
	var rev xdp.NatEntry
	if err := f.dp.Maps.NAT.Lookup(spilled, &rev); err != nil {
		t.Fatalf("the second backend's flow is not in the nat map: %v", err)
	}

	// The agent's check trusts marks that cover every spill, and only
	// those: a spill whose triple lost its bucket hint has no slot to
	// carry a mark.
	f.setSpillsMarked(false)
	if trusted, _, err := f.maps.TrustSNATSpillMarks(); err != nil || !trusted {
		t.Fatalf("marks not trusted with every spill marked: %v", err)
	}
	f.setSpillsMarked(false)
	hint := xdp.SNATHint(second, sent.Src, packet.TCP)
	var bucketHint uint32
	if err := f.dp.Maps.SNATBucketHints.Lookup(hint, &bucketHint); err != nil {
		t.Fatal(err)
	}
	if err := f.dp.Maps.SNATBucketHints.Put(hint, uint32(0)); err != nil {
		t.Fatal(err)
	}
	if trusted, _, err := f.maps.TrustSNATSpillMarks(); err != nil || trusted {
		t.Fatalf("marks trusted with a spill of a triple without a bucket (%v)", err)
	}
	if err := f.dp.Maps.SNATBucketHints.Put(hint, bucketHint); err != nil {
		t.Fatal(err)
	}
	f.setSpillsMarked(true)

	// The first backend's flow on that port ends; its slot is free.
	held, ok, err := f.maps.Flow(dataplane.FlowKey{
		Client:   netip.AddrPortFrom(xdp.NetToAddr(slot.Rev.ClientAddr), xdp.NetToPort(slot.Rev.ClientPort)),
		Frontend: netip.AddrPortFrom(nodeAddr, 30100), Proto: packet.TCP})
	if err != nil || !ok {
		t.Fatalf("flow holding the slot not found: %v", err)
	}
	if err := f.maps.DeleteReverse(held); err != nil {
		t.Fatal(err)
	}
	if _, err := f.maps.DeleteFlow(held); err != nil {
		t.Fatal(err)
	}
	// The bucket's hand offers the spilled port next (and stops resting).
	claimOffered := func(client uint16) uint16 {
		t.Helper()
		f.offerNext(bucket, sent.SrcPort)
		frame.SrcPort = client
		r := f.run(frame.Bytes(), f.nic0)
		f.expectVerdict(r, xdpRedirect)
		return decode(t, r.out).SrcPort
	}
	if got := claimOffered(toSecond[1]); got == sent.SrcPort {
		t.Fatalf("second flow of backend %s got SNAT port %d, which its first flow holds", second, got)
	}
	// Without the mark, the same claim gives the port out twice.
	slot = f.snatSlot(index)
	slot.Flags = 0
	if err := f.dp.Maps.SNATSlots.Put(index, slot); err != nil {
		t.Fatal(err)
	}
	if got := claimOffered(toSecond[2]); got != sent.SrcPort {
		t.Fatalf("unmarked slot: third flow got SNAT port %d, want the spilled %d given twice "+
			"(the check above proves nothing otherwise)", got, sent.SrcPort)
	}
}

// A live flow's spill that an older datapath left unmarked is still looked
// up while the marks are untrusted, and keeps them untrusted. Trusting them
// early would give its port out twice.
func TestUnmarkedSpillKeepsItsPort(t *testing.T) {
	f := newFixture(t)
	in, sent, flow := startSNATFlow(t, f)
	backend := flow.Backend
	f.setSpillsMarked(false)
	f.spill(flow)
	bucket, _ := snatSlotOf(t, f, backend, sent.Src, sent.SrcPort)

	if trusted, _, err := f.maps.TrustSNATSpillMarks(); err != nil || trusted {
		t.Fatalf("marks trusted with a live flow's unmarked spill in the nat map (%v)", err)
	}
	secondPort := func() uint16 {
		t.Helper()
		next := in
		for next.SrcPort++; expectedBackend(webService(), next) != 1; next.SrcPort++ {
		}
		in.SrcPort = next.SrcPort
		f.offerNext(bucket, sent.SrcPort)
		r := f.run(next.Bytes(), f.nic0)
		f.expectVerdict(r, xdpRedirect)
		return decode(t, r.out).SrcPort
	}
	if got := secondPort(); got == sent.SrcPort {
		t.Fatalf("untrusted marks: a new flow got SNAT port %d, which a live spilled flow holds", got)
	}
	f.setSpillsMarked(true)
	if got := secondPort(); got != sent.SrcPort {
		t.Fatalf("trusted marks with an unmarked spill: a new flow got port %d, want the spilled port %d given twice "+
			"(the check above proves nothing otherwise)", got, sent.SrcPort)
	}

}

// oldSpillFixture starts a SNAT flow and spills its reverse half without a
// mark, with the marks untrusted, as after an upgrade; index is the slot.
func oldSpillFixture(t *testing.T) (f *fixture, in, sent packet.Frame, flow dataplane.Flow, index uint32) {
	f = newFixture(t)
	in, sent, flow = startSNATFlow(t, f)
	f.setSpillsMarked(false)
	f.spill(flow)
	_, index = snatSlotOf(t, f, flow.Backend, sent.Src, sent.SrcPort)
	return f, in, sent, flow, index
}

func (f *fixture) expectSpillMark(index uint32, by string) {
	f.t.Helper()
	if slot := f.snatSlot(index); slot.Flags&uint32(xdp.SnatSlotFlagsSNAT_SLOT_SPILLED) == 0 {
		f.t.Fatalf("%s left its spill's slot unmarked (flags %#x)", by, slot.Flags)
	}
}

// A live flow's spill that an older datapath left unmarked gets its mark
// at the flow's next check, and then the marks are trusted.
func TestLiveFlowMarksItsOldSpill(t *testing.T) {
	f, in, sent, flow, index := oldSpillFixture(t)
	if trusted, _, err := f.maps.TrustSNATSpillMarks(); err != nil || trusted {
		t.Fatalf("marks trusted with a live flow's unmarked spill (%v)", err)
	}

	f.ageFlow(flow.Key())
	in.Flags = packet.ACK
	f.expectCounters(map[string]uint64{"redirect": 1}, func() {
		if out := decode(t, f.run(in.Bytes(), f.nic0).out); out.SrcPort != sent.SrcPort {
			t.Fatalf("the flow left from SNAT port %d, want %d", out.SrcPort, sent.SrcPort)
		}
	})
	f.expectSpillMark(index, "the flow's check")
	if trusted, deleted, err := f.maps.TrustSNATSpillMarks(); err != nil || !trusted || deleted != 0 {
		t.Fatalf("after the mark: trusted %v, %d spills deleted, %v; want trusted, none deleted", trusted, deleted, err)
	}
}

// So does a reply to it: a flow whose replies keep it fresh may not send
// a packet of its own for a long time.
func TestReplyMarksAnOldSpill(t *testing.T) {
	f, in, sent, flow, index := oldSpillFixture(t)
	f.ageReverse(flow)
	reply := packet.Frame{Src: flow.Backend.Addr(), Dst: sent.Src, Proto: packet.TCP, SrcPort: flow.Backend.Port(),
		DstPort: sent.SrcPort, Flags: packet.ACK}
	f.expectCounters(map[string]uint64{"reverse_nat": 1, "redirect": 1}, func() {
		if back := decode(t, f.run(reply.Bytes(), f.nic1).out); back.DstPort != in.SrcPort {
			t.Fatalf("reply translated to port %d, want %d", back.DstPort, in.SrcPort)
		}
	})
	f.expectSpillMark(index, "the reply")
}

// The unmarked spill of a flow that has ended (its forward entry evicted,
// and its spill idle past the flow's timeout) is deleted by the agent's
// check, and no longer keeps the marks untrusted.
func TestEndedFlowsUnmarkedSpillIsDeleted(t *testing.T) {
	f := newFixture(t)
	_, _, flow := startSNATFlow(t, f)
	f.setSpillsMarked(false)
	rk := f.spill(flow)
	f.evictFlow(flow.Key())
	f.ageReverseBy(flow, 7*time.Hour) // past the established timeout
	if trusted, deleted, err := f.maps.TrustSNATSpillMarks(); err != nil || !trusted || deleted != 1 {
		t.Fatalf("trusted %v, %d spills deleted, %v; want trusted and the ended flow's spill deleted", trusted, deleted, err)
	}
	var rev xdp.NatEntry
	if err := f.dp.Maps.NAT.Lookup(rk, &rev); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("the ended flow's spill is still in the nat map (%v)", err)
	}
}

// Replies find a tuple's slot before the nat map, so a flow whose spilled
// tuple its slot holds for another flow gets no replies: its next check
// moves it to a new SNAT port.
func TestSpillShadowedByItsSlotMovesPort(t *testing.T) {
	f := newFixture(t)
	in, sent, flow := startSNATFlow(t, f)
	rk := f.spill(flow)
	_, index := snatSlotOf(t, f, flow.Backend, sent.Src, sent.SrcPort)
	slot := f.snatSlot(index)
	slot.Key = rk
	slot.Rev.ClientPort = xdp.PortToNet(in.SrcPort + 1) // another client's flow
	if err := f.dp.Maps.SNATSlots.Put(index, slot); err != nil {
		t.Fatal(err)
	}

	f.ageFlow(flow.Key())
	in.Flags = packet.ACK
	f.expectCounters(map[string]uint64{"nat_port_moved": 1, "redirect": 1}, func() {
		if out := decode(t, f.run(in.Bytes(), f.nic0).out); out.SrcPort == sent.SrcPort {
			t.Fatalf("the flow still leaves from SNAT port %d, whose replies go to another flow", out.SrcPort)
		}
	})
	var rev xdp.NatEntry
	if err := f.dp.Maps.NAT.Lookup(rk, &rev); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("the shadowed spill is still in the nat map (%v)", err)
	}
}
