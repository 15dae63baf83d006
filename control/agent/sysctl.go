package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/xdp"
)

// ProcSys is the directory the node's /proc/sys is reached at; the zero
// value is the process's own /proc/sys. A container sees /proc/sys
// read-only, so deploy/daemonset.yaml mounts the node's /proc/sys/net at
// /host/proc/sys/net and points the agent there (--host-proc-sys). Only
// net/ipv4 is used. Its files apply to the network namespace of the
// process that opens them, whichever path they are opened by: the agent
// runs in the node's (hostNetwork).
type ProcSys string

func (p ProcSys) file(name string) string {
	dir := string(p)
	if dir == "" {
		dir = "/proc/sys"
	}
	return filepath.Join(dir, "net", "ipv4", name)
}

func (p ProcSys) localPortRange() string     { return p.file("ip_local_port_range") }
func (p ProcSys) localReservedPorts() string { return p.file("ip_local_reserved_ports") }

// Check reports whether p holds the files the agent uses.
func (p ProcSys) Check() error {
	for _, f := range []string{p.localPortRange(), p.localReservedPorts()} {
		if _, err := os.Stat(f); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("no %s: not a /proc/sys", f)
		} else if err != nil {
			return err
		}
	}
	return nil
}

// minEphemeralPorts is how many ports of ip_local_port_range the SNAT
// range must leave to the host's own outgoing connections.
const minEphemeralPorts = 1024

// reservedPortsPin names the pin, in the versioned pin directory, of the
// record of the ports the agent itself added to ip_local_reserved_ports.
// It is a one-entry array map holding a portSet: bpffs holds no plain
// files, and a pin lives as long as the other pins (across agent restarts
// and upgrades) and goes with them at `xdplb detach`.
const reservedPortsPin = "reserved_ports"

// portSet is a set of TCP/UDP ports, one bit per port.
type portSet [65536 / 64]uint64

// addRange adds the ports lo to hi.
func (s *portSet) addRange(lo, hi uint16) {
	for p := uint32(lo); p <= uint32(hi); p++ {
		s[p/64] |= 1 << (p % 64)
	}
}

// has reports whether port p is in the set.
func (s *portSet) has(p uint32) bool { return s[p/64]&(1<<(p%64)) != 0 }

// and returns the ports in both s and o.
func (s portSet) and(o portSet) portSet {
	for i := range s {
		s[i] &= o[i]
	}
	return s
}

// or returns the ports in s or o.
func (s portSet) or(o portSet) portSet {
	for i := range s {
		s[i] |= o[i]
	}
	return s
}

// minus returns the ports of s that are not in o.
func (s portSet) minus(o portSet) portSet {
	for i := range s {
		s[i] &^= o[i]
	}
	return s
}

// count is the number of ports in the set.
func (s *portSet) count() int {
	n := 0
	for _, w := range s {
		n += bits.OnesCount64(w)
	}
	return n
}

// String formats the set as the kernel does ip_local_reserved_ports:
// ascending ports and ranges, comma-separated ("22,40000-60999"); "" when
// empty.
func (s portSet) String() string {
	var b strings.Builder
	for p := uint32(0); p < 65536; p++ {
		if !s.has(p) {
			continue
		}
		end := p
		for end+1 < 65536 && s.has(end+1) {
			end++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if end == p {
			fmt.Fprintf(&b, "%d", p)
		} else {
			fmt.Fprintf(&b, "%d-%d", p, end)
		}
		p = end
	}
	return b.String()
}

// parsePortList parses the kernel's ip_local_reserved_ports format.
func parsePortList(text string) (portSet, error) {
	var s portSet
	text = strings.TrimSpace(text)
	if text == "" {
		return s, nil
	}
	for _, part := range strings.Split(text, ",") {
		a, b, isRange := strings.Cut(strings.TrimSpace(part), "-")
		lo, err := strconv.ParseUint(a, 10, 16)
		if err != nil {
			return s, fmt.Errorf("port list %q: %w", text, err)
		}
		hi := lo
		if isRange {
			if hi, err = strconv.ParseUint(b, 10, 16); err != nil {
				return s, fmt.Errorf("port list %q: %w", text, err)
			}
		}
		if hi < lo {
			return s, fmt.Errorf("port list %q: range %s ends below its start", text, part)
		}
		s.addRange(uint16(lo), uint16(hi))
	}
	return s, nil
}

// EphemeralStart is the first port of ip_local_port_range: the host's own
// connections take their ports from there up.
func (p ProcSys) EphemeralStart() (uint16, error) {
	lo, _, err := p.ephemeralRange()
	return uint16(lo), err
}

// ephemeralRange reads ip_local_port_range.
func (p ProcSys) ephemeralRange() (lo, hi int, err error) {
	path := p.localPortRange()
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, fmt.Errorf("read %s: %w", path, err)
	}
	f := strings.Fields(string(raw))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("unexpected %s: %q", path, raw)
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("unexpected %s: %q", path, raw)
	}
	return lo, hi, nil
}

// CheckSNATRange refuses a SNAT range that would leave the host fewer than
// minEphemeralPorts of ip_local_port_range: reserving it would make the
// host's connect() fail. It changes nothing, so it runs before anything
// is loaded (the CLI checks its flags with it).
func (p ProcSys) CheckSNATRange(ports xdp.SNATPorts) error {
	eLo, eHi, err := p.ephemeralRange()
	if err != nil {
		return err
	}
	overlap := ephemeralOverlap(ports, eLo, eHi)
	if left := eHi - eLo + 1 - overlap.count(); left < minEphemeralPorts {
		return fmt.Errorf("SNAT ports %s would leave the host %d of its ephemeral ports "+
			"(ip_local_port_range %d-%d), fewer than %d: choose ranges outside it or smaller ones",
			ports, left, eLo, eHi, minEphemeralPorts)
	}
	return nil
}

// ephemeralOverlap is the SNAT ports the host could also pick for its own
// connections: those within ip_local_port_range eLo-eHi.
func ephemeralOverlap(ports xdp.SNATPorts, eLo, eHi int) portSet {
	var s portSet
	for _, r := range ports.Ranges() {
		lo, hi := max(int(r.Min), eLo), min(int(r.Max), eHi)
		if lo <= hi {
			s.addRange(uint16(lo), uint16(hi))
		}
	}
	return s
}

// snatReservation is what reserveSNATPorts changed in
// ip_local_reserved_ports, for undoSNATReservation.
type snatReservation struct {
	added    portSet // ports it reserved
	released portSet // ports of an earlier range it gave back to the host
}

// reserveSNATPorts keeps the host's own sockets out of the SNAT ports:
// those within ip_local_port_range are added to ip_local_reserved_ports
// (keeping what is there), so no ephemeral port the kernel hands out can
// collide with a translated flow. (Ports outside it the host takes only
// by an explicit bind; the datapath passes over a port the host has a
// socket on.) Ports an
// earlier start added for another range are removed. Which ports the
// agent added (those not reserved already) is recorded under pinRoot, so
// that a later start or ReleaseSNATPorts removes those and nothing that
// was reserved by someone else. CheckSNATRange has accepted the range.
// It returns what it changed there.
func reserveSNATPorts(pinRoot string, procSys ProcSys, ports xdp.SNATPorts, log *slog.Logger) (snatReservation, error) {
	eLo, eHi, err := procSys.ephemeralRange()
	if err != nil {
		return snatReservation{}, err
	}
	want := ephemeralOverlap(ports, eLo, eHi)
	mine, err := loadReservedRecord(pinRoot)
	if err != nil {
		return snatReservation{}, err
	}
	cur, err := procSys.readReservedPorts()
	if err != nil {
		return snatReservation{}, err
	}
	release := mine.minus(want)
	kept := cur.minus(release)
	added := want.minus(kept)
	next := kept.or(want)
	if next == cur {
		// Nothing to write (the range may be reserved by the node):
		// what the agent added and still wants stays its own.
		return snatReservation{}, storeReservedRecord(pinRoot, mine.and(want).and(cur))
	}
	// The record drops the ports to release before they are released:
	// a crash in between leaves them reserved, never removes another's.
	if release.count() > 0 {
		if err := storeReservedRecord(pinRoot, mine.minus(release)); err != nil {
			return snatReservation{}, err
		}
	}
	if err := procSys.writeReservedPorts(next); err != nil {
		// A container sees its /proc/sys read-only: --host-proc-sys
		// names where the node's is mounted, or the node must reserve
		// the range itself (docs/deploying.md's node requirements).
		log.Warn("cannot reserve the SNAT port range from the host's ephemeral ports "+
			"(is --host-proc-sys the node's /proc/sys, mounted writable?): "+
			"host connections may collide with translated flows",
			"ports", ports.String(), "error", err)
		return snatReservation{}, storeReservedRecord(pinRoot, mine.and(cur))
	}
	if err := storeReservedRecord(pinRoot, mine.and(want).and(kept).or(added)); err != nil {
		// Reserved but not recorded: only a later start or detach that
		// finds the record could release the ports added. Those released
		// are returned all the same, for a failed start to reserve them
		// again for the datapath it leaves running.
		return snatReservation{added: added, released: release.and(cur)}, err
	}
	if release.count() > 0 {
		log.Info("SNAT ports of an earlier range released to the host", "ports", release.and(cur).String())
	}
	if added.count() > 0 {
		log.Info("SNAT ports reserved from the host's ephemeral range", "ports", added.String(),
			"ip_local_port_range", fmt.Sprintf("%d-%d", eLo, eHi))
	}
	return snatReservation{added: added, released: release.and(cur)}, nil
}

// undoSNATReservation undoes r, for a start that failed: the ports it
// added leave ip_local_reserved_ports and the record, as far as the record
// still holds them (no one else's reservation is touched), and those it
// released are reserved and recorded again.
func undoSNATReservation(pinRoot string, procSys ProcSys, r snatReservation) error {
	if r.added.count() == 0 && r.released.count() == 0 {
		return nil
	}
	mine, err := loadReservedRecord(pinRoot)
	if err != nil {
		return err
	}
	cur, err := procSys.readReservedPorts()
	if err != nil {
		return err
	}
	undo := r.added.and(mine)
	// The record first: a failure in between leaves the ports reserved,
	// never removes another's.
	if err := storeReservedRecord(pinRoot, mine.minus(undo).or(r.released)); err != nil {
		return err
	}
	next := cur.minus(undo).or(r.released)
	if next == cur {
		return nil
	}
	return procSys.writeReservedPorts(next)
}

// ReleaseSNATPorts removes from ip_local_reserved_ports the ports the
// agent recorded under pinRoot as added by itself, leaving any other
// reservation, clears the record and returns the ports it removed, in the
// kernel's format ("" for none). Nothing recorded (no agent ran, or the
// pins are gone) is not an error.
func ReleaseSNATPorts(pinRoot string, procSys ProcSys) (string, error) {
	mine, err := loadReservedRecord(pinRoot)
	if err != nil || mine.count() == 0 {
		return "", err
	}
	cur, err := procSys.readReservedPorts()
	if err != nil {
		return "", err
	}
	released := mine.and(cur)
	if released.count() > 0 {
		if err := procSys.writeReservedPorts(cur.minus(mine)); err != nil {
			return "", fmt.Errorf("release the SNAT ports %s the agent reserved (remove them from "+
				"net.ipv4.ip_local_reserved_ports by hand): %w", released.String(), err)
		}
	}
	return released.String(), storeReservedRecord(pinRoot, portSet{})
}

func (p ProcSys) readReservedPorts() (portSet, error) {
	path := p.localReservedPorts()
	raw, err := os.ReadFile(path)
	if err != nil {
		return portSet{}, fmt.Errorf("read %s: %w", path, err)
	}
	s, err := parsePortList(string(raw))
	if err != nil {
		return s, fmt.Errorf("read %s: %w", path, err)
	}
	return s, nil
}

func (p ProcSys) writeReservedPorts(s portSet) error {
	// A newline, not an empty write, clears the list: the kernel does
	// not see a write of nothing.
	path := p.localReservedPorts()
	if err := os.WriteFile(path, []byte(s.String()+"\n"), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func reservedRecordPath(pinRoot string) string {
	return filepath.Join(loader.Dir(pinRoot), reservedPortsPin)
}

// reservedRecordSpec is the map the record is kept in.
func reservedRecordSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: "xdplb_rsvports", Type: ebpf.Array, KeySize: 4,
		ValueSize: uint32(len(portSet{}) * 8), MaxEntries: 1}
}

// loadReservedRecord reads the ports recorded under pinRoot; none when
// nothing is pinned there.
func loadReservedRecord(pinRoot string) (portSet, error) {
	var s portSet
	path := reservedRecordPath(pinRoot)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("open the record of reserved SNAT ports %s: %w", path, err)
	}
	defer m.Close()
	if err := m.Lookup(uint32(0), &s); err != nil {
		return s, fmt.Errorf("read the record of reserved SNAT ports %s: %w", path, err)
	}
	return s, nil
}

// storeReservedRecord records s under pinRoot, pinning the record's map
// if it is not pinned yet.
func storeReservedRecord(pinRoot string, s portSet) error {
	path := reservedRecordPath(pinRoot)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		if s.count() == 0 {
			return nil // nothing to remember
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return fmt.Errorf("record reserved SNAT ports: %w", err)
		}
		m, err = ebpf.NewMap(reservedRecordSpec())
		if err == nil {
			if err = m.Pin(path); err != nil {
				m.Close()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("record reserved SNAT ports in %s: %w", path, err)
	}
	defer m.Close()
	if err := m.Put(uint32(0), &s); err != nil {
		return fmt.Errorf("record reserved SNAT ports in %s: %w", path, err)
	}
	return nil
}
