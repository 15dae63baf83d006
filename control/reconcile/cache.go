package reconcile

import (
	"slices"
	"strconv"
	"strings"

	"github.com/xdplb/xdplb/control/maglev"
)

// buildCache remembers Maglev builds by their inputs, so an Apply rebuilds
// only tables whose endpoint set changed, and the ports of a multi-port
// service share one build. Entries unused during an Apply are dropped.
type buildCache struct {
	entries map[string]*cacheEntry
}

type cacheEntry struct {
	// The table as indices into the members, 16 bits each where they fit
	// (always, for any realistic service): tables are the bulk of the
	// agent's memory.
	perm16 []uint16
	perm32 []uint32
	used   bool
}

// size is the number of slots.
func (e *cacheEntry) size() int {
	if e.perm32 != nil {
		return len(e.perm32)
	}
	return len(e.perm16)
}

// at is the member index of slot i.
func (e *cacheEntry) at(i int) uint32 {
	if e.perm32 != nil {
		return e.perm32[i]
	}
	return uint32(e.perm16[i])
}

func newBuildCache() *buildCache { return &buildCache{entries: map[string]*cacheEntry{}} }

func cacheKey(members []maglev.Backend, size uint32) string {
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

// lookup returns the build stored under key, nil if there is none.
func (c *buildCache) lookup(key string) *cacheEntry {
	e := c.entries[key]
	if e != nil {
		e.used = true
	}
	return e
}

// newCacheEntry keeps perm, a table built over members members; perm
// itself is not retained.
func newCacheEntry(perm []uint32, members int) *cacheEntry {
	e := &cacheEntry{used: true}
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

// store keeps e under key.
func (c *buildCache) store(key string, e *cacheEntry) {
	c.entries[key] = e
}

// sweep drops, after a full Apply (when every table was computed), the
// entries no table used since the previous full sweep. Incremental Applies
// only mark entries used.
func (c *buildCache) sweep(full bool) {
	if !full {
		return
	}
	for k, e := range c.entries {
		if !e.used {
			delete(c.entries, k)
		}
		e.used = false
	}
}
