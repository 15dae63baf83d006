package reconcile

import (
	"net/netip"
	"testing"
)

func TestRangesCover(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var ps []netip.Prefix
		for _, s := range ss {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		return ps
	}
	cases := []struct {
		name       string
		cover, old []netip.Prefix
		want       bool
	}{
		{"nothing to cover", pfx("10.0.0.0/24"), nil, true},
		{"nothing covers", nil, pfx("10.0.0.0/24"), false},
		{"the same", pfx("10.0.0.0/24", "10.0.1.0/24"), pfx("10.0.1.0/24", "10.0.0.0/24"), true},
		{"a wider one", pfx("10.0.0.0/16"), pfx("10.0.0.0/24", "10.0.7.0/24"), true},
		{"one removed", pfx("10.0.0.0/24"), pfx("10.0.0.0/24", "10.0.1.0/24"), false},
		{"a narrower one", pfx("10.0.0.0/25"), pfx("10.0.0.0/24"), false},
		{"a disjoint one", pfx("10.0.1.0/24"), pfx("10.0.0.0/24"), false},
		{"split in halves errs closed", pfx("10.0.0.0/25", "10.0.0.128/25"), pfx("10.0.0.0/24"), false},
		{"unmasked", pfx("10.0.0.7/16"), pfx("10.0.3.9/24"), true},
		{"all of IPv4", pfx("0.0.0.0/0"), pfx("10.0.0.0/8", "192.168.0.0/16"), true},
		{"another family", pfx("::/0"), pfx("10.0.0.0/8"), false},
		{"IPv6", pfx("2001:db8::/32"), pfx("2001:db8:1::/48"), true},
	}
	for _, c := range cases {
		if got := rangesCover(c.cover, c.old); got != c.want {
			t.Errorf("%s: rangesCover(%v, %v) = %v, want %v", c.name, c.cover, c.old, got, c.want)
		}
	}
}
