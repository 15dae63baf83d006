package xdp_test

import (
	"net/netip"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
)

// A RST or FIN counts only within its sender's window: one far from the
// sequence numbers its sender was seen to send (a blind attacker's guess)
// is dropped and changes nothing.
func TestRSTAndFINCountOnlyInWindow(t *testing.T) {
	const mark = 1 << 16 // the sequence unit the window is kept in
	type segment = windowSegment
	for _, tc := range []struct {
		name       string
		before     []segment // sent first, each in window
		seg        segment
		wantPassed bool
		wantDrop   string // its counter, when dropped
	}{
		{name: "client RST at its next sequence", seg: segment{flags: packet.RST, seq: 0}, wantPassed: true},
		{name: "client RST far ahead", seg: segment{flags: packet.RST, seq: 300 * mark}, wantDrop: "drop_rst_out_of_window"},
		{name: "client RST far behind", seg: segment{flags: packet.RST | packet.ACK, seq: -40 * mark}, wantDrop: "drop_rst_out_of_window"},
		{name: "client FIN far ahead", seg: segment{flags: packet.FIN | packet.ACK, seq: 1 << 31}, wantDrop: "drop_fin_out_of_window"},
		{name: "client FIN in window", seg: segment{flags: packet.FIN | packet.ACK, seq: mark / 2}, wantPassed: true},
		{name: "client RST after 2.5 MB sent", before: bulk(false, 40, 64000), seg: segment{flags: packet.RST, seq: 40 * 64000}, wantPassed: true},
		{name: "client RST at its ISN after 2.5 MB sent", before: bulk(false, 40, 64000), seg: segment{flags: packet.RST, seq: 0}, wantDrop: "drop_rst_out_of_window"},
		{name: "client RST after a blind ACK far ahead", before: []segment{{flags: packet.ACK, seq: 300 * mark}}, seg: segment{flags: packet.RST, seq: 300 * mark}, wantDrop: "drop_rst_out_of_window"},
		{name: "client RST after a new SYN on the tuple", before: []segment{{flags: packet.SYN, seq: 3000 * mark}}, seg: segment{flags: packet.RST, seq: 3000 * mark}, wantDrop: "drop_rst_out_of_window"},
		{name: "backend RST at its next sequence", seg: segment{fromBackend: true, flags: packet.RST, seq: 1}, wantPassed: true},
		{name: "backend RST far ahead", seg: segment{fromBackend: true, flags: packet.RST, seq: 5000 * mark}, wantDrop: "drop_rst_out_of_window"},
		{name: "backend FIN far ahead", seg: segment{fromBackend: true, flags: packet.FIN | packet.ACK, seq: 9000 * mark}, wantDrop: "drop_fin_out_of_window"},
		{name: "backend RST after 2.5 MB sent", before: bulk(true, 40, 64000), seg: segment{fromBackend: true, flags: packet.RST, seq: 40 * 64000}, wantPassed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.program(oneRemoteBackend())
			in := tcpFrame(clientAddr, 7001, nodeAddr, 30100, packet.SYN, "")
			r := f.run(in.Bytes(), f.nic0)
			f.expectVerdict(r, xdpRedirect)
			sent := decode(t, r.out)
			f.handshake(in, sent)
			key := dataplane.FlowKey{Client: netip.AddrPortFrom(clientAddr, 7001),
				Frontend: netip.AddrPortFrom(nodeAddr, 30100), Proto: packet.TCP}

			frame := func(s segment) (packet.Frame, int) {
				if s.fromBackend {
					fr := replyTo(sent, s.flags)
					fr.Seq = uint32(s.seq)
					return fr, f.nic1
				}
				fr := tcpFrame(clientAddr, 7001, nodeAddr, 30100, s.flags, "")
				fr.Seq = uint32(1001 + s.seq)
				return fr, f.nic0
			}
			for _, s := range tc.before {
				fr, dev := frame(s)
				f.expectVerdict(f.run(fr.Bytes(), dev), xdpRedirect)
			}
			fr, dev := frame(tc.seg)
			want := map[string]uint64{}
			if tc.wantDrop != "" {
				want[tc.wantDrop] = 1
			}
			moved := f.counterDeltas(func() { r = f.run(fr.Bytes(), dev) },
				"drop_rst_out_of_window", "drop_fin_out_of_window", "redirect")
			if passed := r.verdict == xdpRedirect; passed != tc.wantPassed {
				t.Fatalf("segment sent on: %v, want %v (verdict %s)", passed, tc.wantPassed, verdictName(r.verdict))
			}
			for _, name := range []string{"drop_rst_out_of_window", "drop_fin_out_of_window"} {
				if moved[name] != want[name] {
					t.Errorf("counter %s moved by %d, want %d", name, moved[name], want[name])
				}
			}
			closing := dataplane.TCPClosing(f.mustFlow(key).TCPState)
			if closing != tc.wantPassed {
				t.Errorf("flow closing after the segment: %v, want %v", closing, tc.wantPassed)
			}
		})
	}
}

// windowSegment is a TCP segment of the flow from one side.
type windowSegment struct {
	fromBackend bool
	flags       uint8
	seq         int64 // the client's: added to 1001, its first byte; the backend's: as sent (its SYN-ACK was 0)
}

// bulk is n data segments of size bytes from one side, in sequence.
func bulk(fromBackend bool, n int, size int64) []windowSegment {
	out := make([]windowSegment, n)
	for i := range out {
		out[i] = windowSegment{fromBackend: fromBackend, flags: packet.ACK, seq: int64(i) * size}
	}
	return out
}
