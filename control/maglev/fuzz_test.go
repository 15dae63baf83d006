package maglev

import (
	"slices"
	"strings"
	"testing"
)

// FuzzBuild checks Build's invariants on arbitrary backend sets: no panic,
// every slot names a backend with nonzero weight, every such backend owns a
// slot, and the result does not depend on the input order.
func FuzzBuild(f *testing.F) {
	f.Add("a,b,c", []byte{1, 1, 1}, uint8(0), uint64(0))
	f.Add("10.0.0.1:80,10.0.0.2:80", []byte{0, 3}, uint8(1), uint64(42))
	f.Add("x", []byte{}, uint8(2), uint64(1))
	f.Fuzz(func(t *testing.T, ids string, weights []byte, sizeIdx uint8, seed uint64) {
		sizes := SupportedSizes()
		m := sizes[int(sizeIdx)%4] // the small sizes keep runs fast
		var bs []Backend
		for i, id := range strings.Split(ids, ",") {
			w := uint32(1)
			if i < len(weights) {
				w = uint32(weights[i])
				if w >= 200 { // exercise very uneven weights too
					w <<= 24
				}
			}
			bs = append(bs, Backend{ID: id, Weight: w})
		}
		table, err := Build(bs, m, seed)
		if err != nil {
			return // invalid sets (duplicates, empty IDs, too many) are rejected
		}
		nonzero := 0
		for _, b := range bs {
			if b.Weight > 0 {
				nonzero++
			}
		}
		if nonzero == 0 {
			if table != nil {
				t.Fatalf("no weighted backend, got a table of %d slots", len(table))
			}
			return
		}
		if len(table) != int(m) {
			t.Fatalf("table has %d slots, want %d", len(table), m)
		}
		owned := make([]int, len(bs))
		for s, i := range table {
			if int(i) >= len(bs) || bs[i].Weight == 0 {
				t.Fatalf("slot %d names backend %d", s, i)
			}
			owned[i]++
		}
		for i, b := range bs {
			if b.Weight > 0 && owned[i] == 0 {
				t.Fatalf("backend %q (weight %d) owns no slot", b.ID, b.Weight)
			}
		}
		small := true
		for _, b := range bs {
			small = small && b.Weight < 200
		}
		if small && !slices.Equal(table, referenceBuild(bs, m, seed)) {
			t.Fatal("table differs from the documented algorithm")
		}
		again, err := Build(bs, m, seed)
		if err != nil || !slices.Equal(again, table) {
			t.Fatalf("second build differs (err %v)", err)
		}
		rev := slices.Clone(bs)
		slices.Reverse(rev)
		other, err := Build(rev, m, seed)
		if err != nil {
			t.Fatalf("reversed input: %v", err)
		}
		for s := range table {
			if rev[other[s]].ID != bs[table[s]].ID {
				t.Fatalf("slot %d: %q in input order, %q in reversed order", s, bs[table[s]].ID, rev[other[s]].ID)
			}
		}
	})
}
