package reconcile

import (
	"slices"
	"strconv"
	"strings"

	"github.com/xdplb/xdplb/control/maglev"
)

// maglevBuild is a Maglev build: the table as indices into its members,
// 16 bits each where they fit (always, for any realistic service).
type maglevBuild struct {
	perm16 []uint16
	perm32 []uint32
}

// size is the number of slots.
func (e *maglevBuild) size() int {
	if e.perm32 != nil {
		return len(e.perm32)
	}
	return len(e.perm16)
}

// at is the member index of slot i.
func (e *maglevBuild) at(i int) uint32 {
	if e.perm32 != nil {
		return e.perm32[i]
	}
	return uint32(e.perm16[i])
}

// buildKey names a build by its inputs: builds with equal keys are equal.
func buildKey(members []maglev.Backend, size uint32) string {
	var b strings.Builder
	b.WriteString(strconv.FormatUint(uint64(size), 10))
	for _, m := range members {
		b.WriteByte('|')
		b.WriteString(m.ID)
		b.WriteByte('*')
		b.WriteString(strconv.FormatUint(uint64(m.Weight), 10))
	}
	return b.String()
}

// newMaglevBuild keeps perm, a table built over members members; perm
// itself is not retained.
func newMaglevBuild(perm []uint32, members int) *maglevBuild {
	e := &maglevBuild{}
	if members <= 1<<16 {
		e.perm16 = make([]uint16, len(perm))
		for i, v := range perm {
			e.perm16[i] = uint16(v)
		}
	} else {
		e.perm32 = slices.Clone(perm)
	}
	return e
}
