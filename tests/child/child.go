// Package child runs the helper processes of tests and tools (etcd,
// kube-apiserver, the xdplb agent, kube-proxy): each child writes to its
// own log file, cannot outlive the process that started it, and stops with
// SIGTERM, then SIGKILL.
package child

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrKilled is wrapped by [Process.Stop] when a child ignored SIGTERM for
// the whole grace period and was killed.
var ErrKilled = errors.New("killed after ignoring SIGTERM")

// Process is a running (or ended) child.
type Process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the child has been reaped
	waitErr error         // valid after done is closed
}

// Start starts cmd, appending its output to logPath. name is what errors
// and the log's header call it.
//
// The child gets SIGKILL if the thread that forked it exits (Pdeathsig), so
// it cannot outlive a crashed caller. Pdeathsig fires on the death of the
// forking OS thread, not of the process, so the fork happens on a goroutine
// locked to its thread that stays alive until the child is reaped.
func Start(name string, cmd *exec.Cmd, logPath string) (*Process, error) {
	return StartOn(name, cmd, logPath, nil)
}

// StartOn is [Start] with the child bound to cpus (none: wherever the
// scheduler puts it), for children that must keep off the CPUs a
// measurement runs on. The child, and every thread it starts, inherits the
// binding from the thread that forks it.
func StartOn(name string, cmd *exec.Cmd, logPath string, cpus []int) (*Process, error) {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening %s log: %w", name, err)
	}
	fmt.Fprintf(logFile, "==== %s: starting %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(cmd.Args, " "))

	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	p := &Process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}

	started := make(chan error, 1)
	go func() {
		// Deliberately never unlocked: the thread ends with the goroutine,
		// after the child is gone (so its binding goes with it).
		runtime.LockOSThread()
		defer logFile.Close()
		if len(cpus) > 0 {
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				started <- fmt.Errorf("bind to CPUs %v: %w", cpus, err)
				return
			}
		}
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

// Name is the name the child was started with.
func (p *Process) Name() string { return p.name }

// Pid is the child's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the child has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the child has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is how the child ended (as from [exec.Cmd.Wait]); nil while it runs.
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.waitErr
}

// Stop sends SIGTERM, and SIGKILL if the child is still there after grace
// (the error then wraps [ErrKilled]); a zero grace sends SIGKILL at once.
// Stopping a child that already ended returns nil.
func (p *Process) Stop(grace time.Duration) error {
	if p.Exited() {
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
		if grace > 0 {
			return fmt.Errorf("%s: %w (waited %s)", p.name, ErrKilled, grace)
		}
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.Pid())
	}
}

// LogTail returns about the last n lines of the child's log.
func (p *Process) LogTail(n int) string { return FileTail(p.logPath, n) }

// FileTail returns about the last n lines of the file at path, reading at
// most its last 64 KiB.
func FileTail(path string, n int) string {
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
