package dataplane_test

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/xdplb/xdplb/loader"
)

// TestServiceNames reads back what PutServiceNames wrote, for counts
// around and beyond one read batch, and names cut to the entry's size.
func TestServiceNames(t *testing.T) {
	_, d := loadSmall(t, func(o *loader.Options) { o.ServicesMax = 10000 })

	long := "ns/" + strings.Repeat("x", 300) + ":http/TCP"
	for _, n := range []int{0, 1, 4095, 4096, 4097, 9000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			old, err := d.ServiceNames()
			if err != nil {
				t.Fatal(err)
			}
			for id := range old {
				if err := d.DeleteServiceName(id); err != nil {
					t.Fatal(err)
				}
			}
			want := map[uint32]string{}
			for i := 1; i <= n; i++ {
				want[uint32(i)] = fmt.Sprintf("ns-%d/svc-%d:http/TCP", i%7, i)
			}
			if n > 0 {
				want[uint32(n)] = long
			}
			if err := d.PutServiceNames(want); err != nil {
				t.Fatal(err)
			}
			got, err := d.ServiceNames()
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				stored := got[uint32(n)]
				if len(stored) == 0 || !strings.HasPrefix(long, stored) {
					t.Errorf("long name stored as %q, want a prefix of %q", stored, long)
				}
				want[uint32(n)] = stored
			}
			if !maps.Equal(got, want) {
				t.Errorf("read back %d names, want %d (or contents differ)", len(got), len(want))
			}
		})
	}
}
