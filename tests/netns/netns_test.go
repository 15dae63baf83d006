package netns_test

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/xdplb/xdplb/tests/testenv"
)

// Do returns what the function returns, and an error, not a hang, when
// the function ends its goroutine instead (as t.Fatal inside it does).
func TestDoReturnsWhateverTheFunctionDoes(t *testing.T) {
	ns := testenv.NewNetns(t, "do")
	mine := errors.New("mine")
	for _, tc := range []struct {
		name    string
		fn      func() error
		wantErr func(error) bool
	}{
		{"returns nil", func() error { return nil }, func(err error) bool { return err == nil }},
		{"returns an error", func() error { return mine }, func(err error) bool { return errors.Is(err, mine) }},
		{"ends its goroutine", func() error { runtime.Goexit(); return nil }, func(err error) bool { return err != nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- ns.Do(tc.fn) }()
			select {
			case err := <-done:
				if !tc.wantErr(err) {
					t.Errorf("Do returned %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Do did not return")
			}
		})
	}
}
