package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/control/agent"
	"github.com/xdplb/xdplb/control/maglev"
	"github.com/xdplb/xdplb/loader"
)

// env names the environment variable of a flag: --maglev-table-size is
// XDPLB_MAGLEV_TABLE_SIZE.
func env(flag string) []string {
	return []string{"XDPLB_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))}
}

func bpffsFlag() cli.Flag {
	return &cli.StringFlag{Name: "bpffs-root", Value: loader.DefaultPinRoot, EnvVars: env("bpffs-root"),
		Usage: "bpffs directory holding xdplb's pins (mounted if it is not bpffs yet)"}
}

func agentFlags() []cli.Flag {
	d := loader.DefaultOptions()
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "iface", EnvVars: env("iface"),
			Usage: "NIC to attach to (repeatable, or comma-separated); NodePorts listen on its addresses"},
		&cli.StringFlag{Name: "xdp-mode", Value: string(loader.XDPBestEffort), EnvVars: env("xdp-mode"),
			Usage: "XDP attach mode: native, generic or best-effort (native, else generic)"},
		&cli.StringFlag{Name: "services-file", EnvVars: env("services-file"),
			Usage: "read Services and EndpointSlices from this YAML file instead of the Kubernetes API"},
		&cli.StringFlag{Name: "kubeconfig", EnvVars: env("kubeconfig"),
			Usage: "kubeconfig for the Kubernetes API (default: in-cluster configuration)"},
		&cli.StringFlag{Name: "node-name", EnvVars: append(env("node-name"), "NODE_NAME"),
			Usage: "this node's name: endpoints on it are local"},
		&cli.UintFlag{Name: "maglev-table-size", Value: 16381, EnvVars: env("maglev-table-size"),
			Usage: "largest Maglev table; each service port's table is the smallest supported prime >= 100x its backends up to this"},
		&cli.Uint64Flag{Name: "maglev-hash-seed", Value: uint64(d.HashSeed), EnvVars: env("maglev-hash-seed"),
			Usage: "seed of the table and flow hashes; must be the same on every node behind one router"},
		&cli.UintFlag{Name: "conntrack-max", Value: uint(d.ConntrackMax), EnvVars: env("conntrack-max"),
			Usage: "tracked flows"},
		&cli.UintFlag{Name: "nat-max", Value: uint(d.NATMax), EnvVars: env("nat-max"),
			Usage: "reverse NAT entries (one per tracked flow; keep equal to --conntrack-max)"},
		&cli.UintFlag{Name: "services-max", Value: uint(d.ServicesMax), EnvVars: env("services-max"),
			Usage: "service ports (each has an id, counters and up to two Maglev tables)"},
		&cli.UintFlag{Name: "backends-max", Value: uint(d.BackendsMax), EnvVars: env("backends-max"),
			Usage: "distinct endpoint address:port pairs"},
		&cli.UintFlag{Name: "frontends-max", Value: uint(d.FrontendsMax), EnvVars: env("frontends-max"),
			Usage: "frontends (address, port, protocol)"},
		&cli.DurationFlag{Name: "tcp-established-timeout", Value: d.TCPEstablishedTimeout, EnvVars: env("tcp-established-timeout"),
			Usage: "idle timeout of an established TCP flow"},
		&cli.DurationFlag{Name: "tcp-transient-timeout", Value: d.TCPTransientTimeout, EnvVars: env("tcp-transient-timeout"),
			Usage: "idle timeout of a TCP flow while opening or closing"},
		&cli.DurationFlag{Name: "udp-timeout", Value: d.UDPTimeout, EnvVars: env("udp-timeout"),
			Usage: "idle timeout of a UDP flow"},
		&cli.StringFlag{Name: "snat-port-range", Value: fmt.Sprintf("%d-%d", d.SNATPortMin, d.SNATPortMax), EnvVars: env("snat-port-range"),
			Usage: "source ports for SNAT to remote backends, per backend; reserved from the host's ephemeral ports"},
		&cli.StringFlag{Name: "nodeport-range", Value: "30000-32767", EnvVars: env("nodeport-range"),
			Usage: "the cluster's NodePort range (--service-node-port-range)"},
		&cli.StringSliceFlag{Name: "nodeport-addresses", EnvVars: env("nodeport-addresses"),
			Usage: "node addresses for NodePorts: CIDRs, or \"primary\" (default: the addresses of --iface)"},
		bpffsFlag(),
		&cli.StringFlag{Name: "metrics-bind-address", Value: "127.0.0.1:10249", EnvVars: env("metrics-bind-address"),
			Usage: "address of /metrics (empty: off)"},
		&cli.StringFlag{Name: "healthz-bind-address", Value: "0.0.0.0:10256", EnvVars: env("healthz-bind-address"),
			Usage: "address of /healthz and /livez (empty: off)"},
		&cli.StringFlag{Name: "service-proxy-name", EnvVars: env("service-proxy-name"),
			Usage: "handle only Services whose service.kubernetes.io/service-proxy-name label has this value (empty: only unlabelled ones)"},
		&cli.StringFlag{Name: "pod-interfaces", Value: "veth*,lxc*,cali*,azv*,eni*,gke*,cni*", EnvVars: env("pod-interfaces"),
			Usage: "name patterns of host-side pod interfaces"},
		&cli.DurationFlag{Name: "min-sync-period", Value: 10 * time.Millisecond, EnvVars: env("min-sync-period"),
			Usage: "least time between two syncs: bursts of changes are applied together"},
		&cli.DurationFlag{Name: "sync-period", Value: time.Minute, EnvVars: env("sync-period"),
			Usage: "full resync interval"},
		&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: env("log-level"),
			Usage: "debug, info, warn or error"},
		&cli.StringFlag{Name: "log-format", Value: "text", EnvVars: env("log-format"),
			Usage: "text or json"},
	}
}

func agentCommand() *cli.Command {
	return &cli.Command{
		Name:  "agent",
		Usage: "attach the datapath and keep it in step with Services and EndpointSlices",
		Description: "On SIGTERM the agent exits and leaves the datapath attached and pinned, so a\n" +
			"restarted agent takes over without disturbing established flows. `xdplb detach`\n" +
			"removes it.",
		Flags: agentFlags(),
		Action: func(c *cli.Context) error {
			log, err := newLogger(c)
			if err != nil {
				return err
			}
			cfg, err := agentConfig(c)
			if err != nil {
				return err
			}
			a, err := agent.Start(c.Context, cfg, log)
			if err != nil {
				return err
			}
			log.Info("agent started", "version", version, "interfaces", cfg.Interfaces, "node", cfg.NodeName)
			if err := a.Run(c.Context); err != nil {
				return err
			}
			log.Info("agent stopped; datapath stays attached")
			return nil
		},
	}
}

func newLogger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	switch c.String("log-level") {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "warn":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		return nil, usageError("--log-level %q: allowed values are debug, info, warn, error", c.String("log-level"))
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(c.App.ErrWriter, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(c.App.ErrWriter, opts)), nil
	}
	return nil, usageError("--log-format %q: allowed values are text, json", c.String("log-format"))
}

// agentConfig validates every flag; an error names the flag and the
// allowed values, and nothing has been attached yet.
func agentConfig(c *cli.Context) (agent.Config, error) {
	cfg := agent.Config{
		ServicesFile:   c.String("services-file"),
		Kubeconfig:     c.String("kubeconfig"),
		NodeName:       c.String("node-name"),
		ProxyName:      c.String("service-proxy-name"),
		MetricsAddress: c.String("metrics-bind-address"),
		HealthzAddress: c.String("healthz-bind-address"),
		PodInterfaces:  c.String("pod-interfaces"),
		MinSyncPeriod:  c.Duration("min-sync-period"),
		SyncPeriod:     c.Duration("sync-period"),
		HealthTimeout:  time.Minute,
	}
	for _, v := range c.StringSlice("iface") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" && !slices.Contains(cfg.Interfaces, name) {
				cfg.Interfaces = append(cfg.Interfaces, name)
			}
		}
	}
	if len(cfg.Interfaces) == 0 {
		return cfg, usageError("--iface: at least one network interface is required")
	}
	for _, name := range cfg.Interfaces {
		if len(name) > 15 || strings.ContainsAny(name, "/ \t") {
			return cfg, usageError("--iface %q: not a valid interface name", name)
		}
	}
	mode, err := loader.ParseXDPMode(c.String("xdp-mode"))
	if err != nil {
		return cfg, usageError("--xdp-mode %q: allowed values are native, generic, best-effort", c.String("xdp-mode"))
	}
	cfg.XDPMode = mode

	if cfg.ServicesFile != "" && cfg.Kubeconfig != "" {
		return cfg, usageError("--services-file and --kubeconfig: choose one source")
	}
	if cfg.ServicesFile != "" {
		if st, err := os.Stat(cfg.ServicesFile); err == nil && st.IsDir() {
			return cfg, usageError("--services-file %q: is a directory, want a YAML file", cfg.ServicesFile)
		}
	}
	if cfg.Kubeconfig != "" {
		if _, err := os.Stat(cfg.Kubeconfig); err != nil {
			return cfg, usageError("--kubeconfig %q: %v", cfg.Kubeconfig, err)
		}
	}

	size := c.Uint("maglev-table-size")
	if _, err := maglev.CheckSize(uint32(size), 1); err != nil || size > 1<<20 {
		return cfg, usageError("--maglev-table-size %d: allowed values are %s", size, joinUints(maglev.SupportedSizes()))
	}
	cfg.MaglevTableSize = uint32(size)
	cfg.MaglevSeed = c.Uint64("maglev-hash-seed")

	opts := loader.DefaultOptions()
	opts.PinRoot = c.String("bpffs-root")
	if opts.PinRoot == "" {
		return cfg, usageError("--bpffs-root: must not be empty")
	}
	opts.HashSeed = uint32(cfg.MaglevSeed) ^ uint32(cfg.MaglevSeed>>32)
	for _, f := range []struct {
		name string
		dst  *uint32
		min  uint
		max  uint
	}{
		{"conntrack-max", &opts.ConntrackMax, 1024, 1 << 27},
		{"nat-max", &opts.NATMax, 1024, 1 << 27},
		{"services-max", &opts.ServicesMax, 2, 1 << 22},
		{"backends-max", &opts.BackendsMax, 2, 1 << 24},
		{"frontends-max", &opts.FrontendsMax, 1, 1 << 24},
	} {
		v := c.Uint(f.name)
		if v < f.min || v > f.max {
			return cfg, usageError("--%s %d: allowed values are %d to %d", f.name, v, f.min, f.max)
		}
		*f.dst = uint32(v)
	}
	opts.AffinityMax = max(opts.ConntrackMax/8, 1024)
	opts.SourceRangesMax = max(opts.ServicesMax, 1024)
	for _, f := range []struct {
		name string
		dst  *time.Duration
	}{
		{"tcp-established-timeout", &opts.TCPEstablishedTimeout},
		{"tcp-transient-timeout", &opts.TCPTransientTimeout},
		{"udp-timeout", &opts.UDPTimeout},
	} {
		d := c.Duration(f.name)
		if d < time.Second || d > 7*24*time.Hour {
			return cfg, usageError("--%s %s: allowed values are 1s to 168h", f.name, d)
		}
		*f.dst = d
	}
	if c.Duration("min-sync-period") < 0 || c.Duration("min-sync-period") > time.Minute {
		return cfg, usageError("--min-sync-period %s: allowed values are 0 to 1m", c.Duration("min-sync-period"))
	}
	if c.Duration("sync-period") < time.Second {
		return cfg, usageError("--sync-period %s: must be at least 1s", c.Duration("sync-period"))
	}

	snatLo, snatHi, err := parsePortRange(c.String("snat-port-range"))
	if err != nil {
		return cfg, usageError("--snat-port-range %q: %v (want LOW-HIGH within 1024-65535)", c.String("snat-port-range"), err)
	}
	if snatLo < 1024 {
		return cfg, usageError("--snat-port-range %q: ports below 1024 are privileged; allowed values are within 1024-65535", c.String("snat-port-range"))
	}
	if int(snatHi)-int(snatLo) < 1023 {
		return cfg, usageError("--snat-port-range %q: at least 1024 ports are needed", c.String("snat-port-range"))
	}
	opts.SNATPortMin, opts.SNATPortMax = snatLo, snatHi
	npLo, npHi, err := parsePortRange(c.String("nodeport-range"))
	if err != nil {
		return cfg, usageError("--nodeport-range %q: %v (want LOW-HIGH)", c.String("nodeport-range"), err)
	}
	if snatLo <= npHi && npLo <= snatHi {
		return cfg, usageError("--snat-port-range %s overlaps --nodeport-range %s: they must be disjoint",
			c.String("snat-port-range"), c.String("nodeport-range"))
	}
	cfg.NodePortMin, cfg.NodePortMax = npLo, npHi
	for _, v := range c.StringSlice("nodeport-addresses") {
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			if s == "primary" {
				cfg.NodePortPrimary = true
				continue
			}
			p, err := netip.ParsePrefix(s)
			if err != nil || !p.Addr().Is4() {
				return cfg, usageError("--nodeport-addresses %q: want IPv4 CIDRs or \"primary\"", s)
			}
			cfg.NodePortAddresses = append(cfg.NodePortAddresses, p.Masked())
		}
	}
	if cfg.NodePortPrimary && len(cfg.NodePortAddresses) > 0 {
		return cfg, usageError("--nodeport-addresses: \"primary\" cannot be combined with CIDRs")
	}
	if err := opts.Validate(); err != nil {
		return cfg, usageError("%v", err)
	}
	cfg.Datapath = opts
	return cfg, nil
}

func parsePortRange(s string) (uint16, uint16, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("not a range")
	}
	a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if err1 != nil || err2 != nil || a == 0 {
		return 0, 0, fmt.Errorf("ports must be numbers from 1 to 65535")
	}
	if a > b {
		return 0, 0, fmt.Errorf("low end above high end")
	}
	return uint16(a), uint16(b), nil
}

func joinUints(v []uint32) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatUint(uint64(x), 10)
	}
	return strings.Join(s, ", ")
}
