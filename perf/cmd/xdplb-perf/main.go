// Command xdplb-perf runs xdplb's perf suite and writes its report.
//
//	go run ./perf/cmd/xdplb-perf -quick -check   # make perf-quick: every mode, a representative subset
//	go run ./perf/cmd/xdplb-perf                 # make perf: the full matrix
//
// It needs root. Results go to perf/results/<timestamp>/ (report.json,
// report.md, report.svg and the logs of every process it ran); -publish DIR
// also copies the report there (perf/report holds the one docs/performance.md
// shows). Exit status: 0 on success, 1 when the run failed or -check found
// a mode that should have produced a figure and did not, 2 for bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/xdplb/xdplb/perf/suite"
	"github.com/xdplb/xdplb/perf/summary"
)

func main() {
	os.Exit(run())
}

func run() int {
	var (
		quick     = flag.Bool("quick", false, "a representative subset, under a minute: established and new flows at 1 Service, every mode, one repetition")
		check     = flag.Bool("check", false, "fail unless every available mode produced a figure for every scenario it ran")
		out       = flag.String("out", "", "output directory (default perf/results/<timestamp>)")
		publish   = flag.String("publish", "", "also copy report.{md,svg,json} to this directory (e.g. perf/report)")
		modes     = flag.String("modes", "", "comma-separated modes to run (default: all): "+strings.Join(summary.ModeOrder, ", "))
		scenarios = flag.String("scenarios", "", "comma-separated scenario ids to run (default: all of the step)")
		services  = flag.String("services", "", "comma-separated Service counts (default 1,1000,10000,100000; quick: 1)")
		generator = flag.String("generator", "auto", "auto (kernel pktgen when /proc/net/pktgen exists, else BPF live frames), bpf or pktgen")
		threads   = flag.Int("threads", 1, "generator threads, one per CPU")
		size      = flag.Int("size", 64, "frame size in bytes (without FCS), 64 to 1514")
		reps      = flag.Int("reps", 0, "repetitions per scenario (default 6, quick 1)")
		rounds    = flag.Int("rounds", 0, "rounds of every mode the first step's repetitions are spread over (default 3, quick 1)")
		backends  = flag.Int("backends", 16, "endpoints of each Service that gets traffic")
		xdplbBin  = flag.String("xdplb", "", "xdplb binary to test (default: build ./cmd/xdplb)")
		kpBin     = flag.String("kube-proxy", "", "kube-proxy binary (default: the cached build, or build it from the Go module proxy)")
		timeout   = flag.Duration("timeout", 0, "give up after this long (default 90m, quick 10m)")
		verbose   = flag.Bool("v", false, "debug logging")
	)
	flag.Parse()
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)

	counts, err := parseCounts(*services)
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdplb-perf: -services:", err)
		return 2
	}
	if *size < 64 || *size > 1514 || *threads < 1 || *backends < 1 || *backends > 200 || *reps < 0 || *rounds < 0 {
		fmt.Fprintln(os.Stderr, "xdplb-perf: -size must be 64-1514, -threads >= 1, -backends 1-200, -reps and -rounds >= 0")
		return 2
	}
	if err := suite.CheckSelection(splitList(*modes), splitList(*scenarios)); err != nil {
		fmt.Fprintln(os.Stderr, "xdplb-perf:", err)
		return 2
	}
	switch *generator {
	case "auto", "bpf", "pktgen":
	default:
		fmt.Fprintf(os.Stderr, "xdplb-perf: -generator %q: want auto, bpf or pktgen\n", *generator)
		return 2
	}
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdplb-perf:", err)
		return 2
	}
	dir := *out
	if dir == "" {
		dir = filepath.Join(root, "perf", "results", time.Now().UTC().Format("20060102-150405"))
	}
	if *timeout == 0 {
		*timeout = 90 * time.Minute
		if *quick {
			*timeout = 10 * time.Minute
		}
	}
	// A closed stdout (| head) must not kill the run before it cleans up.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	rep, err := suite.Run(ctx, suite.Config{
		Quick: *quick, OutDir: dir, RepoRoot: root,
		XDPLB: *xdplbBin, KubeProxy: *kpBin, Generator: *generator,
		Threads: *threads, FrameSize: *size, Reps: *reps, Rounds: *rounds, Backends: *backends, Services: counts,
		Modes: splitList(*modes), Scenarios: splitList(*scenarios), Log: log,
	})
	if err != nil {
		log.Error("perf run failed", "err", err)
		return 1
	}
	fmt.Printf("report: %s\n\n%s", filepath.Join(dir, "report.md"), rep.Markdown(""))
	if *publish != "" {
		if err := rep.Write(*publish); err != nil {
			log.Error("publish", "err", err)
			return 1
		}
		fmt.Printf("\npublished to %s\n", *publish)
	}
	if *check {
		if err := rep.Check(); err != nil {
			log.Error("perf check failed: a mode that should run produced no figure", "err", err)
			return 1
		}
		log.Info("perf check passed: every available mode produced a figure")
	}
	return 0
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		mult := 1
		if n, ok := strings.CutSuffix(f, "k"); ok {
			f, mult = n, 1000
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive count", f)
		}
		out = append(out, n*mult)
	}
	return out, nil
}

// repoRoot finds the xdplb module above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			strings.Contains(string(b), "module github.com/xdplb/xdplb\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from inside the xdplb repository (go.mod not found)")
		}
		dir = parent
	}
}
