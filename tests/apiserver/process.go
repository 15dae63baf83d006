package apiserver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// process is one child (etcd or kube-apiserver) whose output goes to a log
// file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the child has been reaped
	waitErr error         // valid after done is closed
}

// startProcess starts bin with args, appending its output to logPath.
//
// The child gets SIGKILL if the thread that forked it exits (Pdeathsig), so
// it cannot outlive a crashed test binary. Pdeathsig fires on the death of
// the forking OS thread, not of the process, so the fork happens on a
// goroutine locked to its thread that stays alive until the child is reaped.
func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening %s log: %w", name, err)
	}
	fmt.Fprintf(logFile, "==== %s: starting %s %s\n", time.Now().Format(time.RFC3339Nano), name, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}

	started := make(chan error, 1)
	go func() {
		// Deliberately never unlocked: the thread ends with the goroutine,
		// after the child is gone.
		runtime.LockOSThread()
		defer logFile.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return p, nil
}

// exited reports whether the child has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, and SIGKILL if the child is still there after grace;
// a zero grace sends SIGKILL at once. Stopping a child that already exited
// returns nil.
func (p *process) stop(grace time.Duration) error {
	if p.exited() {
		return nil
	}
	if grace > 0 {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("signalling %s: %w", p.name, err)
		}
		select {
		case <-p.done:
			return nil
		case <-time.After(grace):
		}
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// logTail returns roughly the last n lines of the process log.
func (p *process) logTail(n int) string { return fileTail(p.logPath, n) }

func fileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const maxRead = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > maxRead {
		if _, err := f.Seek(fi.Size()-maxRead, io.SeekStart); err != nil {
			return fmt.Sprintf("(reading log: %v)", err)
		}
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(reading log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
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
func logMentionsPortInUse(p *process) bool {
	return strings.Contains(p.logTail(40), "address already in use")
}
