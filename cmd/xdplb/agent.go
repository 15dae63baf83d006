package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/xdplb/xdplb/control/agent"
	"github.com/xdplb/xdplb/control/maglev"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/xdp"
)

func bpffsFlag() cli.Flag {
	return &cli.StringFlag{Name: "bpffs-root", Value: loader.DefaultPinRoot, EnvVars: env("bpffs-root"),
		Usage: "bpffs directory holding xdplb's pins (mounted if it is not bpffs yet)"}
}

func hostProcSysFlag() cli.Flag {
	return &cli.StringFlag{Name: "host-proc-sys", Value: "/proc/sys", EnvVars: env("host-proc-sys"),
		Usage: "where the node's /proc/sys is (its net/ directory at least): the SNAT port range is reserved in net/ipv4/ip_local_reserved_ports there; a container sees /proc/sys read-only, so deploy/daemonset.yaml mounts the node's /proc/sys/net under /host/proc/sys"}
}

// hostProcSys validates --host-proc-sys (agent and detach).
func hostProcSys(c *cli.Context) (agent.ProcSys, error) {
	dir := c.String("host-proc-sys")
	if !filepath.IsAbs(dir) {
		return "", flagError("host-proc-sys", dir, "not an absolute path")
	}
	p := agent.ProcSys(filepath.Clean(dir))
	if err := p.Check(); err != nil {
		return "", flagError("host-proc-sys", dir, err.Error())
	}
	return p, nil
}

func agentFlags() []cli.Flag {
	d := loader.DefaultOptions()
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "iface", EnvVars: env("iface"), DefaultText: "none, required",
			Usage: "NIC to attach to (repeatable, or comma-separated); NodePorts listen on its addresses"},
		&cli.StringFlag{Name: "xdp-mode", Value: string(loader.XDPBestEffort), EnvVars: env("xdp-mode"),
			Usage: "XDP attach mode: native (in the driver), generic (in the stack), best-effort (native, else generic), or off (the TC program does all the work)"},
		&cli.StringFlag{Name: "services-file", EnvVars: env("services-file"), DefaultText: "none: use the Kubernetes API",
			Usage: "read Services and EndpointSlices from this YAML file instead of the Kubernetes API"},
		&cli.StringFlag{Name: "kubeconfig", EnvVars: env("kubeconfig"), DefaultText: "the in-cluster configuration",
			Usage: "kubeconfig for the Kubernetes API"},
		&cli.StringFlag{Name: "node-name", EnvVars: append(env("node-name"), "NODE_NAME"),
			DefaultText: "the host name with the Kubernetes API, none with --services-file",
			Usage:       "this node's name: endpoints on it are local"},
		&cli.UintFlag{Name: "maglev-table-size", Value: 16381, EnvVars: env("maglev-table-size"),
			Usage: "largest Maglev table; each service port's table is the smallest supported prime >= 100x its backends up to this"},
		&cli.Uint64Flag{Name: "maglev-hash-seed", Value: uint64(d.HashSeed), EnvVars: env("maglev-hash-seed"),
			Usage: "seed of the table and flow hashes; must be the same on every node behind one router"},
		&cli.UintFlag{Name: "conntrack-max", Value: uint(d.ConntrackMax), EnvVars: env("conntrack-max"),
			Usage: "tracked flows once confirmed; flows not confirmed yet (a handshake under way, a UDP flow never answered) have a table of their own, a quarter this size (at least 1024)"},
		&cli.UintFlag{Name: "nat-max", Value: uint(d.NATMax), EnvVars: env("nat-max"), DefaultText: "--conntrack-max",
			Usage: "reverse NAT halves, one per tracked flow (SNAT flows use a port slot array of twice this size)"},
		&cli.UintFlag{Name: "services-max", Value: uint(d.ServicesMax), EnvVars: env("services-max"),
			Usage: "service ports (each has an id, counters and up to two Maglev tables)"},
		&cli.UintFlag{Name: "backends-max", Value: uint(d.BackendsMax), EnvVars: env("backends-max"),
			Usage: "distinct endpoint address:port pairs"},
		&cli.UintFlag{Name: "frontends-max", Value: uint(d.FrontendsMax), EnvVars: env("frontends-max"),
			Usage: "frontends (address, port, protocol)"},
		&cli.StringFlag{Name: "memory-limit", EnvVars: env("memory-limit"), DefaultText: "none",
			Usage: "the memory limit the agent runs under (its container's; deploy/daemonset.yaml passes it): the kernel charges the BPF maps to it, so map sizes that would not fit beside the agent are refused"},
		&cli.DurationFlag{Name: "tcp-established-timeout", Value: d.TCPEstablishedTimeout, EnvVars: env("tcp-established-timeout"),
			Usage: "idle timeout of an established TCP flow"},
		&cli.DurationFlag{Name: "tcp-transient-timeout", Value: d.TCPTransientTimeout, EnvVars: env("tcp-transient-timeout"),
			Usage: "idle timeout of a TCP flow while opening or closing"},
		&cli.DurationFlag{Name: "udp-timeout", Value: d.UDPTimeout, EnvVars: env("udp-timeout"),
			Usage: "idle timeout of a UDP flow"},
		&cli.StringFlag{Name: "snat-port-range", Value: d.SNATPorts.String(), EnvVars: env("snat-port-range"),
			Usage: "source ports for SNAT to remote backends, per backend and node address: one range or two; those within the host's ephemeral ports are reserved from them (at least 1024 must stay the host's), and one below them that the host has a socket on is passed over; by default, when --nodeport-range overlaps it, the two largest pieces left"},
		&cli.StringSliceFlag{Name: "snat-extra-addresses", EnvVars: env("snat-extra-addresses"), DefaultText: "none",
			Usage: "more addresses of the --iface interfaces for SNAT to remote backends: an interface that has some of them spreads its SNAT flows over its address and those, each with --snat-port-range ports of its own (the network must route them to this node)"},
		&cli.StringFlag{Name: "nodeport-range", Value: "30000-32767", EnvVars: env("nodeport-range"),
			Usage: "the cluster's NodePort range (--service-node-port-range)"},
		&cli.UintFlag{Name: "icmp-rate", Value: uint(d.ICMPRate), EnvVars: env("icmp-rate"),
			Usage: fmt.Sprintf("ICMP port unreachables the datapath sends (for a Service without endpoints), per second and CPU after a burst of %d, as the kernel limits its own errors (fragmentation needed is not limited); 0: no limit", loader.ICMPErrorBurst)},
		&cli.StringFlag{Name: "syn-cookies", Value: d.SYNCookies.String(), EnvVars: env("syn-cookies"),
			Usage: "when SYNs to a NodePort, LoadBalancer IP or externalIP (but for host-network backends) are answered with SYN cookies by XDP, which then opens the connections of the clients that answer them (a SYN proxy): auto (while a service port is under a SYN flood, see --syn-flood-threshold), always, or off"},
		&cli.UintFlag{Name: "syn-flood-threshold", Value: uint(d.SYNFloodThreshold), EnvVars: env("syn-flood-threshold"),
			Usage: "with --syn-cookies auto: how many TCP handshakes a service port may leave incomplete within a second before its SYNs are answered with SYN cookies"},
		&cli.StringSliceFlag{Name: "nodeport-addresses", EnvVars: env("nodeport-addresses"), DefaultText: "the addresses of --iface",
			Usage: "node addresses that get NodePorts: those within these CIDRs, or the node's primary address"},
		bpffsFlag(),
		hostProcSysFlag(),
		&cli.StringFlag{Name: "metrics-bind-address", Value: "127.0.0.1:10249", EnvVars: env("metrics-bind-address"),
			Usage: "address of /metrics (empty: off)"},
		&cli.StringFlag{Name: "healthz-bind-address", Value: "0.0.0.0:10256", EnvVars: env("healthz-bind-address"),
			Usage: "address of /healthz and /livez (empty: off)"},
		&cli.StringFlag{Name: "service-proxy-name", EnvVars: env("service-proxy-name"), DefaultText: "none: unlabelled Services only",
			Usage: "handle only Services whose service.kubernetes.io/service-proxy-name label has this value"},
		&cli.StringFlag{Name: "pod-interfaces", Value: "veth*,lxc*,cali*,azv*,eni*,gke*", EnvVars: env("pod-interfaces"),
			Usage: "name patterns of host-side pod interfaces"},
		&cli.StringFlag{Name: "cgroup-root", Value: "auto", EnvVars: env("cgroup-root"),
			Usage: "cgroup v2 directory whose processes reach services through socket programs; \"auto\" finds the root of the node's hierarchy, \"off\" disables; without one (off, or none found) the socket programs an earlier agent attached are removed"},
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

// An agentRunner runs the agent with a validated configuration until ctx
// ends. Tests pass their own to see the configuration, or to stop right
// after the start.
type agentRunner func(ctx context.Context, cfg agent.Config, log *slog.Logger) error

// runAgent starts the agent and runs it until ctx ends.
func runAgent(ctx context.Context, cfg agent.Config, log *slog.Logger) error {
	a, err := agent.Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	log.Info("agent started", "version", version, "interfaces", cfg.Interfaces, "node", cfg.NodeName)
	if err := a.Run(ctx); err != nil {
		return err
	}
	log.Info("agent stopped; datapath stays attached")
	return nil
}

func agentCommand(runAgent agentRunner) *cli.Command {
	return &cli.Command{
		Name:  "agent",
		Usage: "attach the datapath and keep it in step with Services and EndpointSlices",
		Description: "Every flag can also be set by its environment variable (XDPLB_<FLAG>; the\n" +
			"command line wins). Invalid flags exit with code 2 before anything is attached.\n\n" +
			"On SIGTERM the agent exits and leaves the datapath attached and pinned, so a\n" +
			"restarted agent takes over without disturbing established flows. `xdplb detach`\n" +
			"removes it. A second signal ends the agent at once, even while it starts.",
		Flags: agentFlags(),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			log, err := newLogger(c)
			if err != nil {
				return err
			}
			cfg, err := agentConfig(c)
			if err != nil {
				return err
			}
			ctx, stop := untilSignalled(c.Context)
			defer stop()
			return runAgent(ctx, cfg, log)
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
		return nil, flagError("log-level", c.String("log-level"), "unknown level")
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(c.App.ErrWriter, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(c.App.ErrWriter, opts)), nil
	}
	return nil, flagError("log-format", c.String("log-format"), "unknown format")
}

// listValues splits repeatable, comma-separated flag values, dropping
// empty ones and duplicates.
func listValues(c *cli.Context, name string) []string {
	var out []string
	for _, v := range c.StringSlice(name) {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" && !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// pinRoot validates --bpffs-root (shared by every command).
func pinRoot(c *cli.Context) (string, error) {
	root := c.String("bpffs-root")
	if root == "" || !filepath.IsAbs(root) {
		return "", flagError("bpffs-root", root, "not an absolute path")
	}
	if st, err := os.Stat(root); err == nil && !st.IsDir() {
		return "", flagError("bpffs-root", root, "not a directory")
	}
	return filepath.Clean(root), nil
}

// agentConfig validates every flag; an error names the flag and the
// allowed values, and nothing has been attached yet. It only reads the
// system: which interfaces exist, which files do.
func agentConfig(c *cli.Context) (agent.Config, error) {
	cfg := agent.Config{
		ServicesFile:   c.String("services-file"),
		Kubeconfig:     c.String("kubeconfig"),
		NodeName:       c.String("node-name"),
		ProxyName:      c.String("service-proxy-name"),
		MetricsAddress: c.String("metrics-bind-address"),
		HealthzAddress: c.String("healthz-bind-address"),
		PodInterfaces:  c.String("pod-interfaces"),
		CgroupRoot:     c.String("cgroup-root"),
		MinSyncPeriod:  c.Duration("min-sync-period"),
		SyncPeriod:     c.Duration("sync-period"),
		HealthTimeout:  time.Minute,
	}
	cfg.Interfaces = listValues(c, "iface")
	if len(cfg.Interfaces) == 0 {
		return cfg, missingFlag("iface")
	}
	for _, name := range cfg.Interfaces {
		if len(name) > 15 || strings.ContainsAny(name, "/: \t") {
			return cfg, flagError("iface", name, "not a valid interface name")
		}
		// The loader would only notice a missing interface when it
		// attaches, after earlier interfaces got the program already.
		if _, err := net.InterfaceByName(name); err != nil {
			return cfg, flagError("iface", name, fmt.Sprintf("no such network interface (have: %s)", interfaceNames()))
		}
	}
	mode, err := loader.ParseXDPMode(c.String("xdp-mode"))
	if err != nil {
		return cfg, flagError("xdp-mode", c.String("xdp-mode"), "unknown mode")
	}
	cfg.XDPMode = mode

	if err := checkSourceFlags(cfg); err != nil {
		return cfg, err
	}
	if cfg.NodeName != "" {
		if errs := validation.IsDNS1123Subdomain(cfg.NodeName); len(errs) > 0 {
			return cfg, flagError("node-name", cfg.NodeName, "not a valid node name")
		}
	}

	size := c.Uint("maglev-table-size")
	if _, err := maglev.CheckSize(uint32(size), 1); err != nil || size > maxMaglevTableSize {
		return cfg, flagError("maglev-table-size", size, "not a supported table size")
	}
	cfg.MaglevTableSize = uint32(size)
	cfg.MaglevSeed = c.Uint64("maglev-hash-seed")

	opts := loader.DefaultOptions()
	if opts.PinRoot, err = pinRoot(c); err != nil {
		return cfg, err
	}
	opts.HashSeed = uint32(cfg.MaglevSeed) ^ uint32(cfg.MaglevSeed>>32)
	// One reverse NAT entry per tracked flow: --nat-max follows
	// --conntrack-max unless given, and may not be smaller.
	natMax := c.Uint("nat-max")
	if !c.IsSet("nat-max") {
		natMax = c.Uint("conntrack-max")
	}
	for _, f := range []struct {
		name     string
		value    uint
		dst      *uint32
		min, max uint
	}{
		{"conntrack-max", c.Uint("conntrack-max"), &opts.ConntrackMax, 1024, 1 << 27},
		{"nat-max", natMax, &opts.NATMax, 1024, 1 << 27},
		{"services-max", c.Uint("services-max"), &opts.ServicesMax, 2, 1 << 22},
		{"backends-max", c.Uint("backends-max"), &opts.BackendsMax, 2, 1 << 24},
		{"frontends-max", c.Uint("frontends-max"), &opts.FrontendsMax, 1, 1 << 24},
		{"icmp-rate", c.Uint("icmp-rate"), &opts.ICMPRate, 0, uint(loader.MaxICMPRate)},
		{"syn-flood-threshold", c.Uint("syn-flood-threshold"), &opts.SYNFloodThreshold, 1, 1 << 30},
	} {
		if f.value < f.min || f.value > f.max {
			return cfg, flagError(f.name, f.value, "out of range")
		}
		*f.dst = uint32(f.value)
	}
	if opts.SYNCookies, err = loader.ParseSYNCookieMode(c.String("syn-cookies")); err != nil {
		return cfg, flagError("syn-cookies", c.String("syn-cookies"), "not a mode")
	}
	if opts.NATMax < opts.ConntrackMax {
		return cfg, flagError("nat-max", opts.NATMax, fmt.Sprintf("below --conntrack-max %d: tracked flows would lose their reverse NAT entries", opts.ConntrackMax))
	}
	opts.AffinityMax = max(opts.ConntrackMax/8, 1024)
	opts.SourceRangesMax = max(opts.ServicesMax, 1024)
	limit, err := memoryLimit(c)
	if err != nil {
		return cfg, err
	}
	if err := checkMapMemory(opts, mapBudget(memTotal(), limit)); err != nil {
		return cfg, err
	}
	for _, f := range []struct {
		name     string
		dst      *time.Duration
		min, max time.Duration
	}{
		{"tcp-established-timeout", &opts.TCPEstablishedTimeout, time.Second, 7 * 24 * time.Hour},
		{"tcp-transient-timeout", &opts.TCPTransientTimeout, time.Second, 7 * 24 * time.Hour},
		{"udp-timeout", &opts.UDPTimeout, time.Second, 7 * 24 * time.Hour},
		// At most half the health timeout: a change that arrives during
		// a sync waits for the next, up to this long after it.
		{"min-sync-period", nil, 0, cfg.HealthTimeout / 2},
		{"sync-period", nil, time.Second, 24 * time.Hour},
	} {
		d := c.Duration(f.name)
		if d < f.min || d > f.max {
			return cfg, flagError(f.name, d, "out of range")
		}
		if f.dst != nil {
			*f.dst = d
		}
	}
	if cfg.MinSyncPeriod > cfg.SyncPeriod {
		return cfg, flagError("min-sync-period", cfg.MinSyncPeriod, fmt.Sprintf("above --sync-period %s", cfg.SyncPeriod))
	}

	npLo, npHi, err := parsePortRange(c.String("nodeport-range"))
	if err != nil {
		return cfg, flagError("nodeport-range", c.String("nodeport-range"), err.Error())
	}
	cfg.NodePortMin, cfg.NodePortMax = npLo, npHi
	if cfg.ProcSys, err = hostProcSys(c); err != nil {
		return cfg, err
	}
	if opts.SNATPorts, err = snatPortsFlag(c, xdp.PortRange{Min: npLo, Max: npHi}, cfg.ProcSys); err != nil {
		return cfg, err
	}
	if opts.SNATSocketCheckBelow, err = snatSocketCheckBelow(cfg.ProcSys); err != nil {
		return cfg, err
	}
	if opts.SNATExtraAddrs, err = snatExtraAddrsFlag(c); err != nil {
		return cfg, err
	}
	for _, s := range listValues(c, "nodeport-addresses") {
		if s == "primary" {
			cfg.NodePortPrimary = true
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() {
			return cfg, flagError("nodeport-addresses", s, "not an IPv4 CIDR")
		}
		cfg.NodePortAddresses = append(cfg.NodePortAddresses, p.Masked())
	}
	if cfg.NodePortPrimary && len(cfg.NodePortAddresses) > 0 {
		return cfg, flagError("nodeport-addresses", strings.Join(listValues(c, "nodeport-addresses"), ","),
			`"primary" cannot be combined with CIDRs`)
	}

	for _, name := range []string{"metrics-bind-address", "healthz-bind-address"} {
		if err := checkBindAddress(c.String(name)); err != nil {
			return cfg, flagError(name, c.String(name), err.Error())
		}
	}
	if bindConflict(cfg.MetricsAddress, cfg.HealthzAddress) {
		return cfg, flagError("metrics-bind-address", cfg.MetricsAddress,
			fmt.Sprintf("takes the same port as --healthz-bind-address %s", cfg.HealthzAddress))
	}
	if errs := validation.IsValidLabelValue(cfg.ProxyName); len(errs) > 0 {
		return cfg, flagError("service-proxy-name", cfg.ProxyName, "not a valid label value")
	}
	for _, p := range strings.Split(cfg.PodInterfaces, ",") {
		if _, err := path.Match(strings.TrimSpace(p), ""); err != nil {
			return cfg, flagError("pod-interfaces", p, "not a valid pattern")
		}
	}
	switch cfg.CgroupRoot {
	case "off", "":
		cfg.CgroupRoot = ""
	case "auto":
		// "" when the node has no cgroup v2 hierarchy: the agent warns.
		cfg.CgroupRoot = loader.FindCgroup2Root()
		cfg.CgroupAuto = true
	default:
		var st unix.Statfs_t
		if !filepath.IsAbs(cfg.CgroupRoot) {
			return cfg, flagError("cgroup-root", cfg.CgroupRoot, "not an absolute path")
		} else if err := unix.Statfs(cfg.CgroupRoot, &st); err != nil {
			return cfg, flagError("cgroup-root", cfg.CgroupRoot, "no such directory")
		} else if st.Type != unix.CGROUP2_SUPER_MAGIC {
			return cfg, flagError("cgroup-root", cfg.CgroupRoot, "not a cgroup v2 directory")
		} else if fi, err := os.Stat(cfg.CgroupRoot); err != nil || !fi.IsDir() {
			// A cgroup's control file (cgroup.procs, say) is on cgroup2
			// too, but programs attach to directories only: the agent
			// would find out after it replaced the programs.
			return cfg, flagError("cgroup-root", cfg.CgroupRoot, "not a directory: a file of the cgroup v2 hierarchy")
		}
	}
	if err := opts.Validate(); err != nil {
		return cfg, usageError("%v", err)
	}
	cfg.Datapath = opts

	// Without a services file or a kubeconfig, the agent must run in a pod.
	if cfg.ServicesFile == "" && cfg.Kubeconfig == "" {
		if _, err := rest.InClusterConfig(); err != nil {
			return cfg, usageError("no source of Services: give --services-file or --kubeconfig, or run the agent in a pod (%v)", err)
		}
	}
	// Without a node name no endpoint is local, and Services with
	// externalTrafficPolicy Local would drop everything: with the
	// Kubernetes API, use the host name, as kube-proxy does.
	if cfg.ServicesFile == "" && cfg.NodeName == "" {
		if h, err := os.Hostname(); err == nil {
			cfg.NodeName = strings.ToLower(h)
		}
	}
	return cfg, nil
}

// checkSourceFlags validates the source of Services: a services file or
// a kubeconfig (or neither: the in-cluster configuration).
func checkSourceFlags(cfg agent.Config) error {
	switch {
	case cfg.ServicesFile != "" && cfg.Kubeconfig != "":
		return flagError("services-file", cfg.ServicesFile, "given together with --kubeconfig: choose one source")
	case cfg.ServicesFile != "":
		if st, err := os.Stat(cfg.ServicesFile); err == nil && st.IsDir() {
			return flagError("services-file", cfg.ServicesFile, "is a directory")
		}
		// The file may appear later; its directory is watched, so it
		// must exist.
		dir := filepath.Dir(cfg.ServicesFile)
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return flagError("services-file", cfg.ServicesFile, fmt.Sprintf("directory %s does not exist", dir))
		}
	case cfg.Kubeconfig != "":
		if st, err := os.Stat(cfg.Kubeconfig); err != nil {
			return flagError("kubeconfig", cfg.Kubeconfig, "no such file")
		} else if st.IsDir() {
			return flagError("kubeconfig", cfg.Kubeconfig, "is a directory")
		}
		if _, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig); err != nil {
			return flagError("kubeconfig", cfg.Kubeconfig, fmt.Sprintf("not a usable kubeconfig: %v", err))
		}
	}
	return nil
}

func interfaceNames() string {
	ifs, err := net.Interfaces()
	if err != nil {
		return "unknown"
	}
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	return strings.Join(names, ", ")
}

// checkBindAddress accepts "", IP:PORT and :PORT.
func checkBindAddress(s string) error {
	if s == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("not IP:PORT")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	if host != "" && host != "localhost" {
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("%q is not an IP address", host)
		}
	}
	return nil
}

// bindConflict reports whether two valid bind addresses would take the
// same port: the same port (compared as numbers) on the same address, or
// with either address unspecified (empty, 0.0.0.0 or ::: all addresses;
// a wildcard listener of Go's takes both families). localhost stands for
// 127.0.0.1, IPv4-mapped IPv6 addresses for their IPv4 ones. Port 0 picks a free port and never conflicts.
func bindConflict(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	hostA, portA, _ := net.SplitHostPort(a)
	hostB, portB, _ := net.SplitHostPort(b)
	pA, errA := strconv.ParseUint(portA, 10, 16)
	pB, errB := strconv.ParseUint(portB, 10, 16)
	if errA != nil || errB != nil || pA != pB || pA == 0 {
		return false
	}
	addrsA, addrsB := bindHosts(hostA), bindHosts(hostB)
	if addrsA == nil || addrsB == nil {
		return true // a wildcard
	}
	for _, x := range addrsA {
		if slices.Contains(addrsB, x) {
			return true
		}
	}
	return false
}

// bindHosts is what a valid bind address's host listens on: nil for all
// addresses.
func bindHosts(host string) []netip.Addr {
	if host == "" {
		return nil
	}
	if host == "localhost" {
		// Go listens on the first address a name resolves to, IPv4
		// first: 127.0.0.1.
		return []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1})}
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return []netip.Addr{} // checkBindAddress refuses it; no conflict
	}
	if ip = ip.Unmap(); ip.IsUnspecified() {
		return nil
	}
	return []netip.Addr{ip}
}

// snatPortsFlag reads --snat-port-range: ports from 1024 up, at least 1024
// of them, apart from the NodePort range, leaving the host its share of
// ephemeral ports. Unset, it is the default less the NodePort range.
func snatPortsFlag(c *cli.Context, nodePorts xdp.PortRange, procSys agent.ProcSys) (xdp.SNATPorts, error) {
	value := c.String("snat-port-range")
	ports := loader.DefaultSNATPortsBeside(nodePorts)
	if c.IsSet("snat-port-range") {
		var err error
		if ports, err = xdp.ParseSNATPorts(value); err != nil {
			return ports, flagError("snat-port-range", value, err.Error())
		}
	}
	for _, r := range ports.Ranges() {
		if r.Min < 1024 {
			return ports, flagError("snat-port-range", value, "ports below 1024 are privileged")
		}
		if r.Min <= nodePorts.Max && nodePorts.Min <= r.Max {
			return ports, flagError("snat-port-range", value,
				fmt.Sprintf("%s overlaps --nodeport-range %s", r, nodePorts))
		}
	}
	if n := ports.Len(); n < 1024 {
		return ports, flagError("snat-port-range", value, fmt.Sprintf("%d ports, at least 1024 are needed", n))
	}
	if err := procSys.CheckSNATRange(ports); err != nil {
		return ports, flagError("snat-port-range", ports.String(), err.Error())
	}
	return ports, nil
}

// snatSocketCheckBelow is where the host's own ports start: SNAT ports
// below are looked up among its sockets before a flow takes one.
func snatSocketCheckBelow(procSys agent.ProcSys) (uint16, error) {
	start, err := procSys.EphemeralStart()
	if err != nil {
		return 0, flagError("host-proc-sys", string(procSys), err.Error())
	}
	return start, nil
}

// snatExtraAddrsFlag reads --snat-extra-addresses: unicast IPv4 addresses
// (listValues drops repeats), at most loader.MaxSNATExtraAddrs.
func snatExtraAddrsFlag(c *cli.Context) ([loader.MaxSNATExtraAddrs]netip.Addr, error) {
	var addrs [loader.MaxSNATExtraAddrs]netip.Addr
	values := listValues(c, "snat-extra-addresses")
	if len(values) > len(addrs) {
		return addrs, flagError("snat-extra-addresses", strings.Join(values, ","),
			fmt.Sprintf("%d addresses, at most %d", len(values), len(addrs)))
	}
	for i, s := range values {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return addrs, flagError("snat-extra-addresses", s, "not an IPv4 address")
		}
		if !a.IsGlobalUnicast() {
			return addrs, flagError("snat-extra-addresses", s, "not a unicast address a node can have")
		}
		addrs[i] = a
	}
	return addrs, nil
}

func parsePortRange(s string) (uint16, uint16, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, errors.New("not a range LOW-HIGH")
	}
	a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if err1 != nil || err2 != nil || a == 0 {
		return 0, 0, errors.New("ports must be numbers from 1 to 65535")
	}
	if a > b {
		return 0, 0, errors.New("low end above high end")
	}
	return uint16(a), uint16(b), nil
}
