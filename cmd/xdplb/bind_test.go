package main

import "testing"

func TestBindConflict(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"127.0.0.1:10256", "127.0.0.1:10256", true},
		{"localhost:10256", "127.0.0.1:10256", true},
		{"localhost:10256", "[::1]:10256", false}, // Go listens on 127.0.0.1 only
		{"localhost:10256", "localhost:10256", true},
		{"[::ffff:127.0.0.1]:10256", "127.0.0.1:10256", true},
		{"127.0.0.1:010256", "127.0.0.1:10256", true},
		{":10256", "127.0.0.1:10256", true},
		{"0.0.0.0:10256", "localhost:10256", true},
		{"[::]:10256", "192.0.2.1:10256", true},
		{"0.0.0.0:10256", "[::1]:10256", true},
		{"[::]:10256", ":10256", true},

		{"localhost:10256", "192.0.2.1:10256", false},
		{"127.0.0.1:10256", "127.0.0.2:10256", false},
		{"localhost:10249", "127.0.0.1:10256", false},
		{":10249", ":10256", false},
		{"127.0.0.1:0", "127.0.0.1:0", false},
		{":0", "localhost:0", false},
		{"", ":10256", false},
		{"localhost:10256", "", false},
	} {
		for _, ab := range [][2]string{{c.a, c.b}, {c.b, c.a}} {
			if got := bindConflict(ab[0], ab[1]); got != c.want {
				t.Errorf("bindConflict(%q, %q) = %v, want %v", ab[0], ab[1], got, c.want)
			}
		}
	}
}
