package maglev

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// makeBackends returns n unweighted backends with IDs like "10.0.1.7:8080",
// starting at the given offset so sets can be extended without clashes.
func makeBackends(n, offset int) []Backend {
	bs := make([]Backend, n)
	for i := range bs {
		k := i + offset
		bs[i] = Backend{ID: fmt.Sprintf("10.%d.%d.%d:8080", k>>16&255, k>>8&255, k&255), Weight: 1}
	}
	return bs
}

// owners maps a table to the IDs it names, which is what must agree between
// nodes whatever order they pass the backends in.
func owners(t testing.TB, bs []Backend, table []uint32) []string {
	t.Helper()
	ids := make([]string, len(table))
	for s, i := range table {
		if int(i) >= len(bs) {
			t.Fatalf("slot %d holds index %d, only %d backends", s, i, len(bs))
		}
		ids[s] = bs[i].ID
	}
	return ids
}

func mustBuild(t testing.TB, bs []Backend, m uint32, seed uint64) []uint32 {
	t.Helper()
	table, err := Build(bs, m, seed)
	if err != nil {
		t.Fatalf("Build(%d backends, M=%d): %v", len(bs), m, err)
	}
	return table
}

// counts returns the number of slots each backend owns.
func counts(table []uint32, n int) []int {
	c := make([]int, n)
	for _, i := range table {
		c[i]++
	}
	return c
}

func TestBuildFillsEverySlot(t *testing.T) {
	tests := []struct {
		name    string
		m       uint32
		weights []uint32
	}{
		{"one backend", 251, []uint32{1}},
		{"two backends", 251, []uint32{1, 1}},
		{"as many as allowed", 251, slices.Repeat([]uint32{1}, 250)},
		{"zero weights mixed in", 509, []uint32{0, 1, 0, 3, 1, 0}},
		{"uneven weights", 4093, []uint32{1, 2, 3, 5, 8, 13, 21}},
		{"huge and tiny weights", 1021, []uint32{1, 1<<32 - 1, 7, 1 << 31}},
		{"100 backends", 16381, slices.Repeat([]uint32{1}, 100)},
		{"1000 backends", 131071, slices.Repeat([]uint32{1}, 1000)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := makeBackends(len(tc.weights), 0)
			for i, w := range tc.weights {
				bs[i].Weight = w
			}
			table := mustBuild(t, bs, tc.m, 1)
			if len(table) != int(tc.m) {
				t.Fatalf("table has %d slots, want %d", len(table), tc.m)
			}
			c := counts(table, len(bs))
			for i, b := range bs {
				if b.Weight == 0 && c[i] != 0 {
					t.Errorf("backend %d has weight 0 but owns %d slots", i, c[i])
				}
				if b.Weight > 0 && c[i] == 0 {
					t.Errorf("backend %d has weight %d but owns no slot", i, b.Weight)
				}
			}
		})
	}
}

func TestBalance(t *testing.T) {
	for _, m := range []uint32{4093, 16381, 65521, 131071} {
		for _, n := range []int{1, 7, 10, 40, 100, 163, 655, 1000, 1310} {
			if uint64(m) < 100*uint64(n) {
				continue
			}
			t.Run(fmt.Sprintf("M=%d/N=%d", m, n), func(t *testing.T) {
				table := mustBuild(t, makeBackends(n, 0), m, 7)
				c := counts(table, n)
				mean := float64(m) / float64(n)
				hi, lo := float64(slices.Max(c))/mean, float64(slices.Min(c))/mean
				t.Logf("max/mean %.4f, min/mean %.4f", hi, lo)
				if hi > 1.01 || lo < 0.99 {
					t.Errorf("max/mean %.4f, min/mean %.4f; want within 1%%", hi, lo)
				}
			})
		}
	}
}

// moved counts the slots whose owner changed between two tables, leaving out
// the slots owned by the backend that left or joined, and returns them as a
// fraction of the slots not owned by that backend.
func moved(before, after []string, changed string) float64 {
	var n, other int
	for s := range before {
		if before[s] == changed || after[s] == changed {
			continue
		}
		other++
		if before[s] != after[s] {
			n++
		}
	}
	return float64(n) / float64(other)
}

type buildFunc func(t testing.TB, bs []Backend, m uint32, seed uint64) []uint32

// disruption removes each of the backends in turn, and adds each of extra in
// turn, and returns the mean and largest fraction of other slots moved.
func disruption(t *testing.T, build buildFunc, bs, extra []Backend, m uint32) (mean, worst float64) {
	t.Helper()
	base := owners(t, bs, build(t, bs, m, 3))
	var sum float64
	var runs int
	record := func(f float64) {
		sum += f
		runs++
		worst = max(worst, f)
	}
	for i := range bs {
		less := slices.Delete(slices.Clone(bs), i, i+1)
		record(moved(base, owners(t, less, build(t, less, m, 3)), bs[i].ID))
	}
	for _, b := range extra {
		more := append(slices.Clone(bs), b)
		record(moved(base, owners(t, more, build(t, more, m, 3)), b.ID))
	}
	return sum / float64(runs), worst
}

func TestDisruption(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a few hundred tables")
	}
	tests := []struct {
		m     uint32
		limit float64
	}{
		{16381, 0.015},
		{65521, 0.0075},
	}
	bs := makeBackends(100, 0)
	extra := makeBackends(30, 1000)
	for _, tc := range tests {
		t.Run(fmt.Sprint("M=", tc.m), func(t *testing.T) {
			mean, worst := disruption(t, mustBuild, bs, extra, tc.m)
			cmean, cworst := disruption(t, classicBuild, bs, extra, tc.m)
			t.Logf("N=100 M=%d: other slots moved mean %.3f%% max %.3f%% (paper's turn order: mean %.3f%% max %.3f%%)",
				tc.m, 100*mean, 100*worst, 100*cmean, 100*cworst)
			if worst > tc.limit {
				t.Errorf("removing or adding one backend moved up to %.3f%% of the other slots, limit %.2f%%", 100*worst, 100*tc.limit)
			}
		})
	}
}

// classicBuild is the paper's turn order (each turn scans to the next free
// slot), with this package's hashing, kept to compare disruption against.
func classicBuild(t testing.TB, bs []Backend, m uint32, seed uint64) []uint32 {
	t.Helper()
	order := make([]uint32, len(bs))
	for i := range order {
		order[i] = uint32(i)
	}
	slices.SortFunc(order, func(a, b uint32) int { return strings.Compare(bs[a].ID, bs[b].ID) })
	pos := make([]uint32, len(bs))
	skip := make([]uint32, len(bs))
	for k, i := range order {
		h := sipHash24(seed, 0, bs[i].ID)
		pos[k], skip[k] = uint32(h)%m, uint32(h>>32)%(m-1)+1
	}
	table := make([]uint32, m)
	taken := make([]bool, m)
	for filled := uint32(0); ; {
		for k, i := range order {
			s := pos[k]
			for taken[s] {
				s = (s + skip[k]) % m
			}
			taken[s], table[s] = true, i
			pos[k] = (s + skip[k]) % m
			if filled++; filled == m {
				return table
			}
		}
	}
}

func TestDeterministic(t *testing.T) {
	bs := makeBackends(100, 0)
	bs[3].Weight, bs[50].Weight, bs[99].Weight = 2, 0, 5
	want := owners(t, bs, mustBuild(t, bs, 16381, 42))
	again := owners(t, bs, mustBuild(t, bs, 16381, 42))
	if !slices.Equal(want, again) {
		t.Fatal("two builds of the same input differ")
	}
	// Another node receives the same backends in another order.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5 {
		other := slices.Clone(bs)
		rng.Shuffle(len(other), func(i, j int) { other[i], other[j] = other[j], other[i] })
		if got := owners(t, other, mustBuild(t, other, 16381, 42)); !slices.Equal(got, want) {
			t.Fatal("shuffled input order gives a different table")
		}
	}
	if got := owners(t, bs, mustBuild(t, bs, 16381, 43)); slices.Equal(got, want) {
		t.Error("a different seed gives the same table")
	}
}

// TestGolden pins the table of a fixed input. Nodes running different builds
// of the agent must agree on every slot, so any change to hashing or filling
// shows up here and must be deliberate.
func TestGolden(t *testing.T) {
	tests := []struct {
		m     uint32
		n     int
		seed  uint64
		first string
		sum   string
	}{
		{251, 3, 0, "10.0.0.0:8080 10.0.0.2:8080 10.0.0.2:8080 10.0.0.0:8080", "94f7704a360d4a5b"},
		{16381, 100, 0x5eed, "10.0.0.8:8080 10.0.0.53:8080 10.0.0.4:8080 10.0.0.50:8080", "3879df08fa44fcdc"},
	}
	for _, tc := range tests {
		bs := makeBackends(tc.n, 0)
		bs[0].Weight = 3
		ids := owners(t, bs, mustBuild(t, bs, tc.m, tc.seed))
		first := strings.Join(ids[:4], " ")
		h := sha256.Sum256([]byte(strings.Join(ids, "\n")))
		sum := hex.EncodeToString(h[:8])
		if first != tc.first || sum != tc.sum {
			t.Errorf("M=%d N=%d seed=%#x: table starts %q, digest %s; want %q, %s", tc.m, tc.n, tc.seed, first, sum, tc.first, tc.sum)
		}
	}
}

func TestWeights(t *testing.T) {
	tests := []struct {
		name    string
		m       uint32
		weights []uint32
	}{
		{"one double among 99", 65521, append([]uint32{2}, slices.Repeat([]uint32{1}, 99)...)},
		{"ten double among 100", 16381, append(slices.Repeat([]uint32{2}, 10), slices.Repeat([]uint32{1}, 90)...)},
		{"small set", 4093, []uint32{1, 2, 3, 4}},
		{"large weights", 16381, []uint32{1000, 2000, 3000, 1000, 1000}},
		{"zero excluded", 2039, []uint32{1, 0, 2, 0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := makeBackends(len(tc.weights), 0)
			var total float64
			for i, w := range tc.weights {
				bs[i].Weight = w
				total += float64(w)
			}
			c := counts(mustBuild(t, bs, tc.m, 9), len(bs))
			for i, w := range tc.weights {
				want := float64(tc.m) * float64(w) / total
				if w == 0 {
					if c[i] != 0 {
						t.Errorf("backend %d: weight 0 owns %d slots", i, c[i])
					}
					continue
				}
				if r := float64(c[i]) / want; r < 0.99 || r > 1.01 {
					t.Errorf("backend %d (weight %d) owns %d slots, want %.1f", i, w, c[i], want)
				}
			}
		})
	}
}

func TestNoEndpoints(t *testing.T) {
	for _, bs := range [][]Backend{nil, {}, {{ID: "a", Weight: 0}, {ID: "b", Weight: 0}}} {
		table, err := Build(bs, 251, 0)
		if table != nil || err != nil {
			t.Errorf("Build(%v) = %v, %v; want nil table and no error", bs, table, err)
		}
	}
}

func TestBuildErrors(t *testing.T) {
	tests := []struct {
		name     string
		backends []Backend
		m        uint32
		want     []string // substrings of the error
	}{
		{"size zero", makeBackends(1, 0), 0, []string{"size 0 ", "251, 509"}},
		{"size not prime", makeBackends(1, 0), 16384, []string{"16384", "16381"}},
		{"prime not supported", makeBackends(1, 0), 65537, []string{"65537", "131071"}},
		{"too many backends", makeBackends(251, 0), 251, []string{"size 251", "(251)"}},
		{"size not checked when empty", nil, 7, []string{"size 7 "}},
		{"duplicate ID", []Backend{{"a", 1}, {"b", 1}, {"a", 2}}, 251, []string{`"a"`, "0 and 2"}},
		{"duplicate zero-weight ID", []Backend{{"a", 0}, {"a", 0}}, 251, []string{`"a"`}},
		{"empty ID", []Backend{{"a", 1}, {"", 1}}, 251, []string{"backend 1", "empty"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			table, err := Build(tc.backends, tc.m, 0)
			if err == nil {
				t.Fatalf("Build succeeded with %d slots, want an error", len(table))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// Only backends with nonzero weight count against the size.
	bs := makeBackends(300, 0)
	for i := 250; i < 300; i++ {
		bs[i].Weight = 0
	}
	if _, err := Build(bs, 251, 0); err != nil {
		t.Errorf("250 weighted backends in 251 slots: %v", err)
	}
}

func TestSupportedSizes(t *testing.T) {
	sizes := SupportedSizes()
	if !slices.IsSorted(sizes) || len(sizes) != 10 {
		t.Fatalf("SupportedSizes() = %v", sizes)
	}
	for _, m := range sizes {
		for d := uint32(2); d*d <= m; d++ {
			if m%d == 0 {
				t.Errorf("%d is divisible by %d", m, d)
			}
		}
	}
	sizes[0] = 7
	if SupportedSizes()[0] != 251 {
		t.Error("changing the returned slice changed the supported sizes")
	}
}

func TestSizeFor(t *testing.T) {
	tests := []struct {
		n    int
		max  uint32
		want uint32
	}{
		{-1, 0, 251},
		{0, 0, 251},
		{1, 0, 251},
		{2, 0, 251},
		{3, 0, 509},
		{100, 0, 16381},
		{164, 0, 32749},
		{1000, 0, 131071},
		{5000, 0, 131071},
		{100, 16381, 16381},
		{1000, 16381, 16381},
		{1000, 20000, 16381},     // cap not itself supported
		{10, 1, 251},             // cap below every size
		{300, 251, 509},          // cap too small for the backends
		{20000, 16381, 32749},    // cap too small for the backends
		{131070, 0, 131071},      // just fits
		{131071, 0, 0},           // nothing fits
		{1 << 40, 1 << 31, 0},    // nothing fits
		{655, 65521, 65521},      // 100n = 65500
		{656, 65521, 65521},      // capped
		{656, 4_000_000, 131071}, // cap above every size
	}
	for _, tc := range tests {
		if got := SizeFor(tc.n, tc.max); got != tc.want {
			t.Errorf("SizeFor(%d, %d) = %d, want %d", tc.n, tc.max, got, tc.want)
		}
	}
}

func TestCheckSize(t *testing.T) {
	tests := []struct {
		m       uint32
		n       int
		warn    bool
		wantErr string
	}{
		{16381, 100, false, ""},
		{16381, 163, false, ""},
		{16381, 164, true, ""},
		{251, 250, true, ""},
		{251, 0, false, ""},
		{251, 251, false, "larger than the number of backends (251)"},
		{1000, 1, false, "size 1000 is not supported (allowed: 251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071)"},
		{251, -1, false, "negative"},
	}
	for _, tc := range tests {
		warn, err := CheckSize(tc.m, tc.n)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("CheckSize(%d, %d) error = %v, want one containing %q", tc.m, tc.n, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("CheckSize(%d, %d): %v", tc.m, tc.n, err)
		}
		if (warn != "") != tc.warn {
			t.Errorf("CheckSize(%d, %d) warning = %q, want warning: %v", tc.m, tc.n, warn, tc.warn)
		}
	}
	// Whatever SizeFor picks, Build accepts.
	for n := 0; n < 2000; n += 37 {
		if _, err := CheckSize(SizeFor(n, 16381), n); err != nil {
			t.Errorf("SizeFor(%d, 16381) is rejected: %v", n, err)
		}
	}
}

func BenchmarkBuild(b *testing.B) {
	for _, m := range []uint32{16381, 65521} {
		for _, n := range []int{10, 100, 1000} {
			if uint32(n) >= m {
				continue
			}
			bs := makeBackends(n, 0)
			b.Run(fmt.Sprintf("M=%d/N=%d", m, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := Build(bs, m, 1); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkBuildWeighted uses weights 1 to 4 instead of equal weights.
func BenchmarkBuildWeighted(b *testing.B) {
	bs := makeBackends(100, 0)
	for i := range bs {
		bs[i].Weight = uint32(1 + i%4)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Build(bs, 16381, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClassic times the paper's turn order (the plain implementation in
// this file), as a baseline for BenchmarkBuild in the same run.
func BenchmarkClassic(b *testing.B) {
	for _, m := range []uint32{16381, 65521} {
		bs := makeBackends(100, 0)
		b.Run(fmt.Sprintf("M=%d/N=100", m), func(b *testing.B) {
			for b.Loop() {
				classicBuild(b, bs, m, 1)
			}
		})
	}
}

func TestBuildIntoReusesBuffer(t *testing.T) {
	backends := func(n int, weight uint32) []Backend {
		out := make([]Backend, n)
		for i := range out {
			out[i] = Backend{ID: fmt.Sprintf("10.0.%d.%d", i/256, i%256), Weight: weight + uint32(i%3)}
		}
		return out
	}
	tests := []struct {
		name     string
		backends []Backend
		m        uint32
	}{
		{"large", backends(100, 1), 16381},
		{"smaller after larger", backends(10, 1), 1021},
		{"weighted", backends(7, 5), 509},
		{"larger again", backends(3, 1), 4093},
	}
	var buf []uint32
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, err := Build(tc.backends, tc.m, 9)
			if err != nil {
				t.Fatal(err)
			}
			got, err := BuildInto(buf, tc.backends, tc.m, 9)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("BuildInto with a used buffer differs from Build")
			}
			buf = got
		})
	}
}

// TestCheckMatchesBuild checks that Check reports what Build returns:
// the same error, and slots exactly when Build returns a table.
func TestCheckMatchesBuild(t *testing.T) {
	tests := []struct {
		name     string
		backends []Backend
		m        uint32
	}{
		{"one backend", makeBackends(1, 0), 251},
		{"weighted", []Backend{{"a", 1}, {"b", 3}, {"c", 0}}, 509},
		{"none", nil, 251},
		{"all weight zero", []Backend{{"a", 0}, {"b", 0}}, 251},
		{"size not supported", makeBackends(1, 0), 16384},
		{"too many backends", makeBackends(251, 0), 251},
		{"duplicate ID", []Backend{{"a", 1}, {"b", 1}, {"a", 2}}, 251},
		{"empty ID", []Backend{{"a", 1}, {"", 1}}, 251},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			table, berr := Build(tc.backends, tc.m, 0)
			slots, cerr := Check(tc.backends, tc.m)
			if fmt.Sprint(cerr) != fmt.Sprint(berr) {
				t.Errorf("Check error %v, Build error %v", cerr, berr)
			}
			if slots != (len(table) > 0) {
				t.Errorf("Check slots = %v, Build returned %d slots", slots, len(table))
			}
		})
	}
}
