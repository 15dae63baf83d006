package xdp_test

import (
	"os"
	"testing"
)

// TestMain lets the test binary double as the host process of the socket
// program tests (see hostClient): those programs act on the processes of
// a cgroup, and only a process of its own can be put in one.
func TestMain(m *testing.M) {
	if os.Getenv(hostClientEnv) != "" {
		os.Exit(hostClient(os.Args[1:]))
	}
	os.Exit(m.Run())
}
