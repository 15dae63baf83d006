package dataplane

import (
	"testing"
	"time"

	"github.com/xdplb/xdplb/xdp"
)

func TestSYNCookiesDueAsTheDatapathJudges(t *testing.T) {
	const now = 100 * time.Second
	window := func(age time.Duration) uint64 { return uint64(now - age) }
	for _, tc := range []struct {
		name string
		f    xdp.SynFlood
		want bool
	}{
		{"this window reaches the threshold", xdp.SynFlood{WindowNs: window(0), Opened: 150, Completed: 40}, true},
		{"this window's handshakes completed", xdp.SynFlood{WindowNs: window(0), Opened: 500, Completed: 450}, false},
		{"the last window reached it", xdp.SynFlood{WindowNs: window(500 * time.Millisecond), IncompleteBefore: 100}, true},
		{"counts a window old become the last window's", xdp.SynFlood{WindowNs: window(1500 * time.Millisecond), Opened: 100}, true},
		{"the last window's are forgotten a window on", xdp.SynFlood{WindowNs: window(1500 * time.Millisecond), IncompleteBefore: 100}, false},
		{"counts two windows old", xdp.SynFlood{WindowNs: window(3 * time.Second), Opened: 1000}, false},
		{"never counted", xdp.SynFlood{}, false},
	} {
		if got := synCookiesDue(tc.f, 100, now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
