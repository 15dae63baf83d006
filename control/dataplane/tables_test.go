package dataplane_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
)

func TestPutTables(t *testing.T) {
	_, d := loadSmall(t, func(o *loader.Options) { o.ServicesMax = 2048 })

	slotsOf := func(id uint32, size int) []uint32 {
		out := make([]uint32, size)
		for i := range out {
			out[i] = (id*7+uint32(i))%50 + 1
		}
		return out
	}
	tests := []struct {
		name  string
		count int // tables, ids 1..count
		size  func(id uint32) int
		salt  uint32
	}{
		{"one", 1, func(uint32) int { return 251 }, 0},
		{"mixed sizes", 40, func(id uint32) int { return []int{1, 251, 1021, 16381}[id%4] }, 0},
		{"more than one batch", 2100, func(uint32) int { return 251 }, 0},
		{"replace", 600, func(uint32) int { return 1021 }, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var tables []dataplane.TableContent
			want := map[uint32][]uint32{}
			for id := uint32(1); id <= uint32(tc.count); id++ {
				slots := slotsOf(id+tc.salt, tc.size(id))
				want[id] = slots
				tables = append(tables, dataplane.TableContent{ID: id, Size: len(slots),
					Fill: func(dst []uint32) error { copy(dst, slots); return nil }})
			}
			n, err := d.PutTables(context.Background(), tables)
			if err != nil || n != len(tables) {
				t.Fatalf("PutTables = %d, %v; want %d, nil", n, err, len(tables))
			}
			for id, slots := range want {
				got, err := d.Table(id)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, slots) {
					t.Fatalf("table %d: %d slots read back differ from the %d written", id, len(got), len(slots))
				}
			}
		})
	}

	if _, err := d.PutTables(context.Background(), []dataplane.TableContent{{ID: 0, Size: 1,
		Fill: func(dst []uint32) error { dst[0] = 1; return nil }}}); err == nil {
		t.Error("table id 0 accepted")
	}
	fail := errors.New("no content")
	_, err := d.PutTables(context.Background(), []dataplane.TableContent{{ID: 4000, Size: 251,
		Fill: func([]uint32) error { return fail }}})
	if !errors.Is(err, fail) {
		t.Errorf("PutTables with a failing Fill = %v, want its error", err)
	}
	if _, err := d.Table(4000); err == nil {
		t.Error("a table whose Fill failed was installed")
	}
}
