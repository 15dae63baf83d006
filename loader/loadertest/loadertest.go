// Package loadertest helps tests load a real datapath with small maps.
package loadertest

import (
	"log/slog"

	"github.com/xdplb/xdplb/loader"
)

// SmallOptions returns the default options with maps sized for tests
// (a thousand flows, a few dozen services and backends), pinned under
// pinRoot (a private bpffs, see testenv.BPFFS).
func SmallOptions(pinRoot string) loader.Options {
	opts := loader.DefaultOptions()
	opts.PinRoot = pinRoot
	opts.ConntrackMax, opts.NATMax, opts.AffinityMax = 1024, 1024, 256
	opts.ServicesMax, opts.FrontendsMax, opts.BackendsMax, opts.SourceRangesMax = 64, 256, 64, 64
	return opts
}

// Load loads a datapath and commits its pins at once, for tests that do
// not exercise a failed start (loader.Datapath.Revert).
func Load(opts loader.Options, log *slog.Logger) (*loader.Datapath, error) {
	dp, err := loader.Load(opts, log)
	if err != nil {
		return nil, err
	}
	if err := dp.CommitPins(); err != nil {
		dp.Close()
		return nil, err
	}
	return dp, nil
}
