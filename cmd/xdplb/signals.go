package main

import (
	"context"
	"os/signal"
	"syscall"
)

// untilSignalled returns a context that ends at the first SIGTERM or
// SIGINT, for the commands that must not stop half-way: the agent (which
// then leaves the datapath attached) and detach (which finishes). Only the
// first signal is caught: once ctx ends, the default action is back, so a
// second signal ends the process at once, whatever it is waiting for.
// The read-only commands catch none: Ctrl-C ends them.
func untilSignalled(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	context.AfterFunc(ctx, stop)
	return ctx, stop
}
