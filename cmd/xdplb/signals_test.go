package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// signalHelperEnv makes the test binary run signalHelper instead of tests.
const signalHelperEnv = "XDPLB_TEST_SIGNAL_HELPER"

// signalHelper stands for a command that takes long to stop: it catches
// the first signal through untilSignalled and then does not return.
func signalHelper() {
	ctx, stop := untilSignalled(context.Background())
	defer stop()
	fmt.Println("ready")
	<-ctx.Done()
	fmt.Println("stopping")
	time.Sleep(time.Minute)
	os.Exit(0)
}

func TestMain(m *testing.M) {
	if os.Getenv(signalHelperEnv) == "1" {
		signalHelper()
	}
	os.Exit(m.Run())
}

// TestSecondSignalEndsTheProcess checks that the first SIGINT ends the
// command's context and the next ends the process, however long its
// shutdown would take.
func TestSecondSignalEndsTheProcess(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), signalHelperEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := bufio.NewScanner(out)
	expect := func(want string) {
		t.Helper()
		if !lines.Scan() || lines.Text() != want {
			t.Fatalf("helper said %q (%v), want %q", lines.Text(), lines.Err(), want)
		}
	}
	expect("ready")
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	expect("stopping") // the first signal ended the context, not the process

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The default action comes back just after the context ends: signal
	// until it takes effect.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case err := <-exited:
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("helper ended with %v, want killed by SIGINT", err)
			}
			if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
				t.Fatalf("helper ended with %v, want killed by SIGINT", err)
			}
			return
		case <-tick.C:
			_ = cmd.Process.Signal(syscall.SIGINT)
		case <-deadline:
			t.Fatal("a second SIGINT did not end the process in 20 s")
		}
	}
}
