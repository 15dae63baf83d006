// Package maglev builds Maglev consistent-hashing lookup tables
// (Eisenbud et al., "Maglev: A Fast and Reliable Software Network Load
// Balancer", NSDI 2016).
//
// # The algorithm
//
// A table has a prime number M of slots; a flow hashes to a slot and the slot
// names its backend. Each backend i derives a preference list over all slots
// from two hashes of its identity:
//
//	offset_i  = h1(id_i) mod M
//	skip_i    = h2(id_i) mod (M-1) + 1
//	perm_i[j] = (offset_i + j*skip_i) mod M
//
// Because M is prime and 1 <= skip_i < M, perm_i visits every slot exactly
// once. In the paper, backends take turns claiming the next free slot on their
// list until all M slots are full, so each backend gets M/N slots (±1), and a
// change of the backend set moves few slots owned by the others.
//
// # The variant built here
//
// With 100 backends, when one of them leaves or joins, the paper's turn order
// also moves about 1.4% (up to 1.5%) of the slots that neither belonged to
// nor go to that backend at M=16381, and about 0.6% at M=65521. The cause is
// that a turn scans forward over any number of taken slots: once one claim
// changes, a backend's position on its list shifts, and with it every later
// claim of that backend. This package keeps the preference lists and changes
// the order of claims, which halves that extra movement (about 0.7%, up to
// 0.8%, at M=16381 and 0.3% at M=65521; the tests check the bounds):
//
//   - Every backend with weight w > 0 gets a quota of slots proportional to w
//     (largest-remainder rounding of M*w/W, where W is the sum of weights; ties
//     go to the backend that sorts first, and a backend whose quota would round
//     to zero takes one slot from the largest quota, ties again to the first).
//     Quotas make the balance exact: equal weights give every backend
//     floor(M/N) or ceil(M/N) slots, and weight ratios hold to within a slot,
//     without requiring the weights to sum to M.
//   - Claims proceed in rounds. In each round, every backend that has not
//     filled its quota, in ID order, adds its weight to a credit (starting
//     at zero); if the credit has reached the largest weight Wmax, the
//     backend pays Wmax and looks at exactly one more entry of its list,
//     taking the slot if it is still free. With equal weights every backend
//     looks at one entry per round; a lighter backend walks its list
//     proportionally slower.
//
// Backends thus walk their lists in lockstep (in proportion to weight), and
// a slot goes to the first backend to reach it, by (round, ID order), among
// those still short of their quota. A freed or newly contested slot only
// displaces claims along a short chain instead of shifting whole lists. The
// filling always ends: the quotas sum to M, and the list of a backend with
// quota left still contains every free slot.
//
// # Determinism
//
// Every node must compute the same table for the same backend set, so the
// result depends only on the set of (ID, weight) pairs, M and the seed: the
// backends are ordered by ID (byte-wise), and the hashes are
//
//	H  = SipHash-2-4 of the ID's bytes, key k0 = seed, k1 = 0
//	     (k0 and k1 are the little-endian halves of the 128-bit key)
//	h1 = H mod 2^32   (low 32 bits)
//	h2 = H >> 32      (high 32 bits)
//
// No map iteration, randomness or platform-dependent hashing is involved.
package maglev

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// Backend is one member of a table.
type Backend struct {
	// ID is the backend's stable identity, the same on every node, for
	// example "10.0.1.5:8080". It is what the hashes are computed from, so
	// it must not depend on anything local to a node.
	ID string
	// Weight is the backend's relative share of slots. Weight 0 means the
	// backend gets no slots at all (it stays in the input only so the
	// caller's indices keep their meaning); pass 1 for unweighted backends.
	Weight uint32
}

// supportedSizes are the table sizes Build accepts: primes just below powers
// of two, in ascending order.
var supportedSizes = [...]uint32{251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071}

// SupportedSizes returns the table sizes Build accepts, in ascending order.
// Every one is prime.
func SupportedSizes() []uint32 {
	return slices.Clone(supportedSizes[:])
}

// supported reports whether m is one of the supported sizes.
func supported(m uint32) bool {
	_, ok := slices.BinarySearch(supportedSizes[:], m)
	return ok
}

func sizesList() string {
	s := make([]string, len(supportedSizes))
	for i, m := range supportedSizes {
		s[i] = fmt.Sprint(m)
	}
	return strings.Join(s, ", ")
}

// SizeFor returns the table size to use for a service with nBackends
// backends: the smallest supported size of at least 100*nBackends (which keeps
// the imbalance between backends under 1%), but no larger than maxSize.
// maxSize 0 means no cap other than the largest supported size; a maxSize
// that is not itself supported caps at the largest supported size below it.
//
// The cap never makes the result unusable: when no supported size within the
// cap is larger than nBackends, SizeFor returns the smallest supported size
// that is, ignoring the cap. It returns 0 only when no supported size is
// larger than nBackends. The result depends on nothing but the arguments, so
// nodes configured alike size a service's table alike.
func SizeFor(nBackends int, maxSize uint32) uint32 {
	if nBackends < 0 {
		nBackends = 0
	}
	want := uint64(nBackends) * 100
	var size uint32
	for _, m := range supportedSizes {
		if maxSize != 0 && m > maxSize {
			break
		}
		size = m
		if uint64(m) >= want {
			break
		}
	}
	if size != 0 && uint64(size) > uint64(nBackends) {
		return size
	}
	// The cap leaves no usable size: take the smallest one that works.
	for _, m := range supportedSizes {
		if uint64(m) > uint64(nBackends) {
			return m
		}
	}
	return 0
}

// CheckSize validates a table size for nBackends backends with nonzero
// weight. It returns an error when Build would reject the size, and a
// non-empty warning when the size is accepted but smaller than
// 100*nBackends, where backends' shares start to differ by more than ~1%.
func CheckSize(m uint32, nBackends int) (warning string, err error) {
	if !supported(m) {
		return "", fmt.Errorf("maglev: table size %d is not supported (allowed: %s)", m, sizesList())
	}
	if nBackends < 0 {
		return "", fmt.Errorf("maglev: negative backend count %d", nBackends)
	}
	if uint64(m) <= uint64(nBackends) {
		return "", fmt.Errorf("maglev: table size %d must be larger than the number of backends (%d); allowed sizes: %s",
			m, nBackends, sizesList())
	}
	if uint64(m) < 100*uint64(nBackends) {
		return fmt.Sprintf("maglev: table size %d is below 100 x %d backends; shares may differ by more than 1%%", m, nBackends), nil
	}
	return "", nil
}

// cursor is one backend's progress through its preference list.
type cursor struct {
	pos    uint32 // next slot on the list
	skip   uint32
	need   uint32 // slots still to claim
	weight uint32
	credit uint64
	index  uint32 // index into the caller's slice
}

// Build returns a lookup table of m slots. Each entry is an index into
// backends, the caller's slice, naming the backend that owns the slot; only
// backends with nonzero weight appear. The order of the input does not matter:
// the table is computed on the backends ordered by ID, so two callers passing
// the same backends in different orders get tables that name the same backend
// in every slot (the indices differ only as their slices differ).
//
// m must be one of SupportedSizes and larger than the number of backends with
// nonzero weight. IDs must be non-empty and unique. A backend set with no
// nonzero weight yields a nil table and no error: the service has no
// endpoints. Every backend with nonzero weight owns at least one slot.
func Build(backends []Backend, m uint32, seed uint64) ([]uint32, error) {
	return BuildInto(nil, backends, m, seed)
}

// BuildInto is Build writing the table into buf's storage when it has room
// for m slots (so a caller building many tables can reuse one buffer); it
// returns the table.
func BuildInto(buf []uint32, backends []Backend, m uint32, seed uint64) ([]uint32, error) {
	order, err := weighted(backends, m)
	if err != nil || len(order) == 0 {
		return nil, err
	}
	n := len(order)
	cs := make([]cursor, n)
	var wmax uint32
	for k, i := range order {
		b := backends[i]
		h := sipHash24(seed, 0, b.ID)
		cs[k] = cursor{
			pos:    uint32(h) % m,
			skip:   uint32(h>>32)%(m-1) + 1,
			weight: b.Weight,
			index:  i,
		}
		wmax = max(wmax, b.Weight)
	}
	setQuotas(cs, m)

	table := slices.Grow(buf[:0], int(m))[:m]
	clear(table)
	fill(table, cs, wmax)
	return table, nil
}

// Check returns the error Build would return for backends and m, and
// whether the table Build returns would have slots (some backend has
// nonzero weight), without building it.
func Check(backends []Backend, m uint32) (slots bool, err error) {
	order, err := weighted(backends, m)
	return len(order) > 0, err
}

// weighted validates Build's arguments and returns the indices of the
// backends with nonzero weight, ordered by ID.
func weighted(backends []Backend, m uint32) ([]uint32, error) {
	if !supported(m) {
		return nil, fmt.Errorf("maglev: table size %d is not supported (allowed: %s)", m, sizesList())
	}
	if uint64(len(backends)) >= 1<<32 {
		return nil, errors.New("maglev: too many backends")
	}
	order := make([]uint32, len(backends))
	for i := range order {
		order[i] = uint32(i)
	}
	slices.SortFunc(order, func(a, b uint32) int {
		return strings.Compare(backends[a].ID, backends[b].ID)
	})
	for k, i := range order {
		id := backends[i].ID
		if id == "" {
			return nil, fmt.Errorf("maglev: backend %d has an empty ID", i)
		}
		if k > 0 && backends[order[k-1]].ID == id {
			return nil, fmt.Errorf("maglev: duplicate backend ID %q (indices %d and %d)", id, order[k-1], i)
		}
	}
	order = slices.DeleteFunc(order, func(i uint32) bool { return backends[i].Weight == 0 })
	if n := len(order); n > 0 && uint64(m) <= uint64(n) {
		return nil, fmt.Errorf("maglev: table size %d must be larger than the number of backends with nonzero weight (%d); allowed sizes: %s",
			m, n, sizesList())
	}
	return order, nil
}

// setQuotas sets each cursor's need to its share of m slots, proportional to
// its weight, by largest remainder; every cursor gets at least one slot.
// It requires len(cs) < m.
func setQuotas(cs []cursor, m uint32) {
	var total uint64
	for _, c := range cs {
		total += uint64(c.weight)
	}
	rem := make([]uint64, len(cs))
	left := m
	for k := range cs {
		share := uint64(m) * uint64(cs[k].weight)
		cs[k].need = uint32(share / total)
		rem[k] = share % total
		left -= cs[k].need
	}
	if left > 0 {
		// left < len(cs): hand one extra slot each to the largest remainders.
		byRem := make([]int, len(cs))
		for k := range byRem {
			byRem[k] = k
		}
		slices.SortStableFunc(byRem, func(a, b int) int { return cmp.Compare(rem[b], rem[a]) })
		for _, k := range byRem[:left] {
			cs[k].need++
		}
	}
	for k := range cs {
		if cs[k].need > 0 {
			continue
		}
		// A tiny weight rounded to nothing: take a slot from the largest
		// quota, which holds at least two since len(cs) < m.
		big := 0
		for j := range cs {
			if cs[j].need > cs[big].need {
				big = j
			}
		}
		cs[big].need--
		cs[k].need = 1
	}
}

// fill assigns every slot of table to a cursor's index, updating cs.
// The quotas in cs must sum to len(table) and wmax must be the largest weight.
func fill(table []uint32, cs []cursor, wmax uint32) {
	m := uint32(len(table))
	taken := make([]uint64, (m+63)/64)
	// active lists the cursors with quota left, in ID order.
	active := make([]uint32, len(cs))
	uniform := true
	for k := range active {
		active[k] = uint32(k)
		uniform = uniform && cs[k].weight == wmax
	}
	for len(active) > 1 {
		k := 0
		if uniform {
			// Equal weights: one probe each per round.
			for _, a := range active {
				c := &cs[a]
				c.probe(table, taken)
				if c.need > 0 {
					active[k] = a
					k++
				}
			}
			active = active[:k]
			continue
		}
		probed := false
		for _, a := range active {
			c := &cs[a]
			// weight <= wmax, so a round buys at most one probe.
			if c.credit += uint64(c.weight); c.credit >= uint64(wmax) {
				c.credit -= uint64(wmax)
				probed = true
				c.probe(table, taken)
			}
			if c.need > 0 {
				active[k] = a
				k++
			}
		}
		active = active[:k]
		if !probed && k > 0 {
			skipIdleRounds(cs, active, wmax)
		}
	}
	if len(active) == 1 {
		// The last backend with quota left has exactly as many slots to
		// claim as are free, so it takes all of them whatever the order.
		idx := cs[active[0]].index
		for w, word := range taken {
			for free := ^word; free != 0; free &= free - 1 {
				s := uint32(w)<<6 | uint32(bits.TrailingZeros64(free))
				if s >= m {
					break
				}
				table[s] = idx
			}
		}
	}
}

// probe looks at the next slot on c's list and claims it if it is free.
// taken has one bit per slot of table.
func (c *cursor) probe(table []uint32, taken []uint64) {
	s := c.pos
	pos := s + c.skip
	if m := uint32(len(table)); pos >= m {
		pos -= m
	}
	c.pos = pos
	w, bit := s>>6, uint64(1)<<(s&63)
	if taken[w]&bit == 0 {
		taken[w] |= bit
		table[s] = c.index
		c.need--
	}
}

// skipIdleRounds advances every cursor's credit past the rounds in which no
// cursor would reach wmax, as if those rounds had run. Only backends lighter
// than the heaviest have idle rounds, so this matters only once all the
// heaviest ones are done.
func skipIdleRounds(cs []cursor, active []uint32, wmax uint32) {
	// Rounds until a cursor probes again: ceil((wmax-credit)/weight).
	var rounds uint64 = 1<<64 - 1
	for _, a := range active {
		c := &cs[a]
		rounds = min(rounds, (uint64(wmax)-c.credit+uint64(c.weight)-1)/uint64(c.weight))
	}
	if rounds <= 1 {
		return
	}
	for _, a := range active {
		cs[a].credit += (rounds - 1) * uint64(cs[a].weight)
	}
}
