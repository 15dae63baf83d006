package reconcile

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/xdplb/xdplb/control/maglev"
)

// tableBuild is a Maglev build for one or more tables to be written
// (ports with the same members, such as the ports of one Service, share
// one). The goroutine that writes a table makes its build, in the buffer
// it writes the table from; a build with several users is made once and
// kept until they are written.
type tableBuild struct {
	members []maglev.Backend
	size    uint32
	seed    uint64
	users   int // set before the tables are written

	once sync.Once
	perm []uint32 // slot -> member, kept for several users
	err  error
	// built and took tell whether the build was made, and how long it
	// took; read them once the tables are written.
	built bool
	took  time.Duration
}

// fill writes the slots of a table of b with member backend ids ids into
// dst, of b.size slots.
func (b *tableBuild) fill(dst []uint32, ids []uint32) error {
	var perm []uint32
	var err error
	if b.users > 1 {
		b.once.Do(func() { b.perm, b.err = b.build(nil) })
		perm, err = b.perm, b.err
	} else {
		perm, err = b.build(dst)
	}
	if err != nil {
		return err
	}
	if len(perm) != len(dst) {
		return fmt.Errorf("maglev build of %d slots for a table of %d", len(perm), len(dst))
	}
	for i, m := range perm {
		dst[i] = ids[m]
	}
	return nil
}

// build makes the build in buf's storage if it has room.
func (b *tableBuild) build(buf []uint32) ([]uint32, error) {
	start := time.Now()
	perm, err := maglev.BuildInto(buf, b.members, b.size, b.seed)
	b.took = time.Since(start)
	b.built = err == nil
	return perm, err
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
