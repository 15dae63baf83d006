package maglev

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// referenceBuild follows the package documentation literally, round by
// round, with none of Build's shortcuts. It is slow for very uneven weights.
func referenceBuild(bs []Backend, m uint32, seed uint64) []uint32 {
	var order []int
	for i, b := range bs {
		if b.Weight > 0 {
			order = append(order, i)
		}
	}
	if len(order) == 0 {
		return nil
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(bs[a].ID, bs[b].ID) })
	n := len(order)
	var total, wmax uint64
	for _, i := range order {
		total += uint64(bs[i].Weight)
		wmax = max(wmax, uint64(bs[i].Weight))
	}
	// Quotas by largest remainder, ties to the backend that sorts first.
	quota := make([]uint64, n)
	rem := make([]uint64, n)
	var given uint64
	for k, i := range order {
		quota[k] = uint64(m) * uint64(bs[i].Weight) / total
		rem[k] = uint64(m) * uint64(bs[i].Weight) % total
		given += quota[k]
	}
	bumped := make([]bool, n)
	for ; given < uint64(m); given++ {
		best := -1
		for k := range rem {
			if !bumped[k] && (best < 0 || rem[k] > rem[best]) {
				best = k
			}
		}
		quota[best]++
		bumped[best] = true
	}
	for k := range quota {
		if quota[k] == 0 {
			big := 0
			for j := range quota {
				if quota[j] > quota[big] {
					big = j
				}
			}
			quota[big]--
			quota[k] = 1
		}
	}

	pos := make([]uint64, n)
	skip := make([]uint64, n)
	credit := make([]uint64, n)
	for k, i := range order {
		h := sipHash24(seed, 0, bs[i].ID)
		pos[k] = (h & 0xffffffff) % uint64(m)
		skip[k] = (h>>32)%uint64(m-1) + 1
	}
	table := make([]uint32, m)
	owned := make([]bool, m)
	for filled := uint32(0); filled < m; {
		for k, i := range order {
			if quota[k] == 0 {
				continue
			}
			credit[k] += uint64(bs[i].Weight)
			if credit[k] < wmax {
				continue
			}
			credit[k] -= wmax
			s := pos[k]
			pos[k] = (pos[k] + skip[k]) % uint64(m)
			if !owned[s] {
				owned[s] = true
				table[s] = uint32(i)
				quota[k]--
				filled++
			}
		}
	}
	return table
}

func TestMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for run := range 100 {
		m := SupportedSizes()[rng.IntN(5)]
		n := 1 + rng.IntN(int(m)-1)
		if run%3 == 0 {
			n = 1 + rng.IntN(min(int(m)/20, 100))
		}
		bs := makeBackends(n, rng.IntN(1000))
		uniform := run%2 == 0
		for i := range bs {
			if !uniform {
				bs[i].Weight = uint32(rng.IntN(6)) // some zero
			}
		}
		rng.Shuffle(len(bs), func(i, j int) { bs[i], bs[j] = bs[j], bs[i] })
		seed := rng.Uint64()
		got, err := Build(bs, m, seed)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		if want := referenceBuild(bs, m, seed); !slices.Equal(got, want) {
			t.Fatalf("run %d (M=%d, %d backends): Build differs from the documented algorithm", run, m, n)
		}
	}
}

// Equal weights leave M mod N slots over; they go to the backends that
// sort first.
func TestQuotaTies(t *testing.T) {
	bs := []Backend{{"c", 1}, {"a", 1}, {"b", 1}}
	for name, table := range map[string][]uint32{
		"Build":     mustBuild(t, bs, 251, 0),
		"reference": referenceBuild(bs, 251, 0),
	} {
		if c := counts(table, 3); fmt.Sprint(c) != "[83 84 84]" {
			t.Errorf("%s: slots of c, a, b = %v, want [83 84 84]", name, c)
		}
	}
}
