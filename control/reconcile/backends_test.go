package reconcile

import (
	"net/netip"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
)

func TestBackendListSorted(t *testing.T) {
	be := func(ap string, local bool) backend {
		a := netip.MustParseAddrPort(ap)
		return backend{dataplane.Backend{Addr: a.Addr(), Port: a.Port(), Local: local}}
	}
	tests := []struct {
		name string
		in   []backend
		want []backend
	}{
		{"empty", nil, nil},
		{"ordered by address then port", []backend{be("10.0.0.2:80", false), be("10.0.0.1:81", false), be("10.0.0.1:80", false)},
			[]backend{be("10.0.0.1:80", false), be("10.0.0.1:81", false), be("10.0.0.2:80", false)}},
		{"the last of duplicates wins", []backend{be("10.0.0.1:80", false), be("10.0.0.2:80", false), be("10.0.0.1:80", true)},
			[]backend{be("10.0.0.1:80", true), be("10.0.0.2:80", false)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := backendList(tc.in).sorted()
			if len(got) != len(tc.want) {
				t.Fatalf("sorted = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("sorted = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// serviceOfTable must invert tableID for both endpoint sets: tableWanted
// finds a table's port through it.
func TestServiceOfTable(t *testing.T) {
	for _, svcID := range []uint32{1, 2, 3, 1000, 1<<22 - 1} {
		for _, set := range []tableSet{clusterSet, localSet} {
			if got := serviceOfTable(tableID(svcID, set)); got != svcID {
				t.Errorf("serviceOfTable(tableID(%d, %d)) = %d", svcID, set, got)
			}
		}
	}
}
