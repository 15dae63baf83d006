package suite

import (
	"context"
	"fmt"
	"time"

	"github.com/xdplb/xdplb/perf/traffic"
)

// waitForwarding sends a few new flows to each kind of target until each
// gets through, or timeout. alive reports a datapath that died meanwhile.
func waitForwarding(ctx context.Context, e *env, set ServiceSet, targets []targetKind, timeout time.Duration, alive func() error) error {
	const frames = 64
	names := map[targetKind]string{targetRemote: "remote", targetLocal: "local", targetOne: "single-backend"}
	var probes []scenario
	for _, t := range targets {
		probes = append(probes, scenario{id: names[t], target: t})
	}
	deadline := time.Now().Add(timeout)
	pending := probes
	var last string
	for {
		var still []scenario
		for _, p := range pending {
			spec := newFlowSpec(e, p, set, probeSrc, 256)
			// Probes always use the BPF generator: they must work with
			// any spec.
			r, err := e.send(ctx, e.gen, spec, sinkOf(e, p), traffic.RunOptions{Count: frames}, nil)
			if err != nil {
				return fmt.Errorf("probe %s: %w", p.id, err)
			}
			if r.arrived < frames/2 {
				still = append(still, p)
				last = fmt.Sprintf("%s target: %d of %d probe frames arrived", p.id, r.arrived, frames)
			}
		}
		pending = still
		if len(pending) == 0 {
			return nil
		}
		if alive != nil {
			if err := alive(); err != nil {
				return err
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not forwarding after %s (%s)", timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
