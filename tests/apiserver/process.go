package apiserver

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/xdplb/xdplb/tests/child"
)

// stopChild stops p as [child.Process.Stop] does, but a child that had to
// be killed after its grace period is not an error: the servers' data is
// throwaway.
func stopChild(p *child.Process, grace time.Duration) error {
	if err := p.Stop(grace); err != nil && !errors.Is(err, child.ErrKilled) {
		return err
	}
	return nil
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago. Its
// user must cope with losing a race for it (see startWithRetry).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// errPortTaken marks a start that failed because a chosen port was in use.
var errPortTaken = errors.New("port already in use")

// logMentionsPortInUse reports whether a failed child's log says a port was
// taken, in which case a retry with fresh ports is worthwhile.
func logMentionsPortInUse(p *child.Process) bool {
	return strings.Contains(p.LogTail(40), "address already in use")
}
