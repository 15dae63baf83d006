package loader

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// ctSpec is a conntrack-like LRU hash of n entries.
func ctSpec(n uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: "conntrack", Type: ebpf.LRUHash, KeySize: uint32(binary.Size(xdp.CtKey{})),
		ValueSize: uint32(binary.Size(xdp.CtEntry{})), MaxEntries: n}
}

// ctKey is the i-th test flow.
func ctKey(i uint32) xdp.CtKey {
	return xdp.CtKey{Saddr: i, Daddr: 0x0a000001, Sport: uint16(i), Dport: 80, Proto: 6}
}

// fillConntrack puts n flows into m in random order, flow i last seen at
// i seconds; with batch, n must be a multiple of 4096.
//
// It runs on one CPU: an LRU map gives each CPU that inserts a share of its
// free entries, so inserts from two CPUs find a map of exactly n entries
// full up to 128 entries early (when the thread moves between CPUs).
func fillConntrack(tb testing.TB, m *ebpf.Map, n uint32, batch bool) {
	tb.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		tb.Fatal(err)
	}
	one.Set(0)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		tb.Fatal(err)
	}
	defer unix.SchedSetaffinity(0, &all)
	order := rand.New(rand.NewPCG(1, 2)).Perm(int(n))
	if !batch {
		for _, i := range order {
			if err := m.Put(ctKey(uint32(i)), xdp.CtEntry{LastSeenNs: uint64(i) * 1e9, BackendId: uint32(i)}); err != nil {
				tb.Fatal(err)
			}
		}
		return
	}
	keys := make([]xdp.CtKey, 4096)
	values := make([]xdp.CtEntry, 4096)
	for start := 0; start < len(order); start += len(keys) {
		for j := range keys {
			i := uint32(order[start+j])
			keys[j], values[j] = ctKey(i), xdp.CtEntry{LastSeenNs: uint64(i) * 1e9, BackendId: i}
		}
		if _, err := m.BatchUpdate(keys, values, nil); err != nil {
			tb.Fatal(err)
		}
	}
}

// Replacing a pinned map whose key or value layout changed copies nothing,
// and says so with a warning naming the map and the reason; a map of the
// same layout and another size is copied.
func TestReplacedMapSaysWhyItStartsEmpty(t *testing.T) {
	cases := []struct {
		name     string
		newSpec  func(*ebpf.MapSpec)
		wantWarn string // in the warning's text; "" for none
		copied   int
	}{
		{"value layout changed", func(s *ebpf.MapSpec) { s.ValueSize += 8 }, "value size changed from 56 to 64 bytes", 0},
		{"key layout changed", func(s *ebpf.MapSpec) { s.KeySize += 4 }, "key size changed from 16 to 20 bytes", 0},
		{"larger", func(s *ebpf.MapSpec) { s.MaxEntries *= 2 }, "", 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := testenv.BPFFS(t)
			pinned := ctSpec(1024)
			pinned.Pinning = ebpf.PinByName
			old, err := ebpf.NewMapWithOptions(pinned, ebpf.MapOptions{PinPath: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			fillConntrack(t, old, 100, false)
			spec := ctSpec(1024)
			c.newSpec(spec)
			var logged bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logged, nil))
			if spec.Compatible(old) == nil {
				t.Fatal("the new spec is compatible")
			}
			repl, err := fillReplacement("conntrack", spec, old, migrations(DefaultOptions(), nil)["conntrack"], log)
			if err != nil {
				t.Fatal(err)
			}
			defer repl.m.Close()
			var warning string
			for _, line := range strings.Split(logged.String(), "\n") {
				if strings.Contains(line, "level=WARN") && strings.Contains(line, "starts empty") {
					warning = line
				}
			}
			switch {
			case c.wantWarn != "" && !strings.Contains(warning, c.wantWarn):
				t.Errorf("log %q: want a warning that the map starts empty because %s", logged.String(), c.wantWarn)
			case c.wantWarn == "" && warning != "":
				t.Errorf("warning %q for a map whose entries were copied", warning)
			}
			if repl.copied != c.copied {
				t.Errorf("%d entries copied, want %d", repl.copied, c.copied)
			}
		})
	}
}

// The interfaces' SNAT addresses pinned by a version whose struct iface
// had no extra addresses carry over into the larger values: the new
// programs run before the NICs are registered again.
func TestInterfacesOfAnOlderLayoutAreCopied(t *testing.T) {
	dir := testenv.BPFFS(t)
	older := &ebpf.MapSpec{Name: "ifaces", Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 64,
		Pinning: ebpf.PinByName}
	old, err := ebpf.NewMapWithOptions(older, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	addr := xdp.AddrToNet(netip.MustParseAddr("192.0.2.1"))
	if err := old.Put(uint32(7), [2]uint32{addr, 0}); err != nil {
		t.Fatal(err)
	}
	spec := &ebpf.MapSpec{Name: "ifaces", Type: ebpf.Hash, KeySize: 4,
		ValueSize: uint32(binary.Size(xdp.Iface{})), MaxEntries: 64}
	repl, err := fillReplacement("ifaces", spec, old, migrations(DefaultOptions(), nil)["ifaces"], slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer repl.m.Close()
	var got xdp.Iface
	if err := repl.m.Lookup(uint32(7), &got); err != nil || got.Addr != addr || got.ExtraCount != 0 || repl.copied != 1 {
		t.Errorf("interface 7 after the copy: %+v (%v), %d copied; want address %#x and no extra ones", got, err, repl.copied, addr)
	}
}

// Packet counters pinned by a version with fewer reasons carry over into
// the larger array, every CPU's count at its index.
func TestCountersCarryOverIntoALargerArray(t *testing.T) {
	spec := func(n uint32) *ebpf.MapSpec {
		return &ebpf.MapSpec{Name: "stats", Type: ebpf.PerCPUArray, KeySize: 4,
			ValueSize: uint32(binary.Size(xdp.Counter{})), MaxEntries: n}
	}
	old, err := ebpf.NewMap(spec(3))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	counts := func(i uint32) []xdp.Counter {
		v := make([]xdp.Counter, cpus)
		for c := range v {
			v[c] = xdp.Counter{Packets: uint64(100*i + uint32(c) + 1), Bytes: uint64(1000 * (i + 1))}
		}
		return v
	}
	for i := range uint32(3) {
		if err := old.Put(i, counts(i)); err != nil {
			t.Fatal(err)
		}
	}
	repl, err := fillReplacement("stats", spec(5), old, migrations(DefaultOptions(), nil)["stats"], slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer repl.m.Close()
	if repl.copied != 3 {
		t.Errorf("%d counters copied, want 3", repl.copied)
	}
	for i := range uint32(5) {
		var got []xdp.Counter
		if err := repl.m.Lookup(i, &got); err != nil {
			t.Fatal(err)
		}
		want := make([]xdp.Counter, cpus)
		if i < 3 {
			want = counts(i)
		}
		if !slices.Equal(got, want) {
			t.Errorf("counter %d: %v, want %v", i, got, want)
		}
	}
}

// A conntrack shrunk below its flows keeps those seen last, for each
// LRU map with a last-seen time (conntrack, nat, affinity use one).
func TestShrunkConntrackKeepsRecentFlows(t *testing.T) {
	cases := []struct {
		name      string
		from, to  uint32
		flows     uint32
		keepsMost uint32 // at least this many survive (an LRU evicts a little before it is full)
	}{
		{"to a quarter", 4096, 1024, 4096, 900},
		{"to half, half full", 4096, 2048, 2048, 2000},
		{"grown", 1024, 4096, 1024, 1024},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			from, err := ebpf.NewMap(ctSpec(c.from))
			if err != nil {
				t.Fatal(err)
			}
			defer from.Close()
			to, err := ebpf.NewMap(ctSpec(c.to))
			if err != nil {
				t.Fatal(err)
			}
			defer to.Close()
			fillConntrack(t, from, c.flows, false)
			copied, _, err := migrations(DefaultOptions(), nil)["conntrack"](from, to)
			if err != nil {
				t.Fatal(err)
			}
			if want := min(c.flows, c.to); uint32(copied) != want {
				t.Errorf("%d flows copied, want %d", copied, want)
			}
			// The flows seen last are those of the highest numbers.
			oldestKept := c.flows - min(c.flows, c.to)
			var key xdp.CtKey
			var e xdp.CtEntry
			kept, stale := 0, 0
			iter := to.Iterate()
			for iter.Next(&key, &e) {
				kept++
				if e.BackendId < oldestKept {
					stale++
				}
			}
			if err := iter.Err(); err != nil {
				t.Fatal(err)
			}
			if uint32(kept) < c.keepsMost {
				t.Errorf("%d flows kept, want at least %d", kept, c.keepsMost)
			}
			if stale > 0 {
				t.Errorf("%d of %d flows kept are older than the %d seen last", stale, kept, c.to)
			}
		})
	}
}

// BenchmarkCopyConntrack copies a full conntrack of a million flows into
// one as large and into one half as large (which keeps the flows seen
// last). Needs root; run with -bench CopyConntrack -benchtime 1x.
func BenchmarkCopyConntrack(b *testing.B) {
	const flows = 1 << 20
	for _, to := range []uint32{flows, flows / 2} {
		b.Run(strconv.Itoa(int(to)), func(b *testing.B) {
			testenv.RequirePrivileged(b)
			from, err := ebpf.NewMap(ctSpec(flows))
			if err != nil {
				b.Fatal(err)
			}
			defer from.Close()
			fillConntrack(b, from, flows, true)
			copyCT := migrations(DefaultOptions(), nil)["conntrack"]
			for b.Loop() {
				b.StopTimer()
				dst, err := ebpf.NewMap(ctSpec(to))
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				began := time.Now()
				copied, skipped, err := copyCT(from, dst)
				b.Logf("%d flows into %d entries: %d copied, %d not, in %s", flows, to, copied, skipped, time.Since(began))
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				dst.Close()
				b.StartTimer()
			}
		})
	}
}
