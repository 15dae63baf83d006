package main

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/control/maglev"
	"github.com/xdplb/xdplb/loader"
)

// env names the environment variable of a flag: --maglev-table-size is
// XDPLB_MAGLEV_TABLE_SIZE.
func env(flag string) []string {
	return []string{"XDPLB_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))}
}

// maxMaglevTableSize bounds --maglev-table-size below what the Maglev
// package supports: a table is one inner map per service port.
const maxMaglevTableSize = 1 << 20

func maglevSizes() string {
	var s []string
	for _, m := range maglev.SupportedSizes() {
		if m <= maxMaglevTableSize {
			s = append(s, fmt.Sprint(m))
		}
	}
	return strings.Join(s, ", ")
}

func xdpModes() string {
	var s []string
	for _, m := range loader.XDPModes {
		s = append(s, string(m))
	}
	return strings.Join(s, ", ")
}

const goDuration = "(a Go duration such as 30s, 5m, 6h)"

// fitsMemory is the limit checkMapMemory puts on the map size flags.
const fitsMemory = "all maps together (estimated from these sizes) within the machine's MemTotal and, with --memory-limit, within what it leaves beside the agent"

// allowed says, per flag, which values it accepts: error messages and the
// docs/running.md's flag table quote it, so the two cannot disagree.
var allowed = map[string]string{
	"iface":                   "names of existing network interfaces, at least one (repeat the flag or separate with commas)",
	"xdp-mode":                xdpModes(),
	"services-file":           "a YAML file (it may appear later) in an existing directory; not with --kubeconfig",
	"kubeconfig":              "an existing, valid kubeconfig file; not with --services-file",
	"node-name":               "a Kubernetes node name (a lower-case DNS subdomain)",
	"maglev-table-size":       maglevSizes(),
	"maglev-hash-seed":        "0 to 18446744073709551615",
	"conntrack-max":           "1024 to 134217728; " + fitsMemory,
	"nat-max":                 "1024 to 134217728, at least --conntrack-max; " + fitsMemory,
	"services-max":            "2 to 4194304; " + fitsMemory,
	"backends-max":            "2 to 16777216; " + fitsMemory,
	"frontends-max":           "1 to 16777216; " + fitsMemory,
	"memory-limit":            "a quantity of bytes (1073741824, 1024Mi, 1Gi) of at least " + byteSize(minMemoryLimit) + ", of which the agent takes " + byteSize(agentReserve) + " (the inner Maglev tables, which grow with the Services, are not counted); empty for none",
	"tcp-established-timeout": "1s to 168h " + goDuration,
	"tcp-transient-timeout":   "1s to 168h " + goDuration,
	"udp-timeout":             "1s to 168h " + goDuration,
	"snat-port-range":         "LOW-HIGH or LOW-HIGH,LOW-HIGH (lower range first) within 1024-65535, at least 1024 ports in all, disjoint from --nodeport-range, leaving at least 1024 ports of net.ipv4.ip_local_port_range to the host",
	"snat-extra-addresses":    "up to 8 unicast IPv4 addresses (repeat the flag or separate with commas)",
	"nodeport-range":          "LOW-HIGH within 1-65535, disjoint from --snat-port-range",
	"icmp-rate":               "0 (no limit) to 1000000000",
	"syn-cookies":             "auto, always or off",
	"syn-flood-threshold":     "1 to 1073741824",
	"nodeport-addresses":      `IPv4 CIDRs, or "primary" alone (repeat the flag or separate with commas)`,
	"bpffs-root":              "an absolute path: a bpffs mount, or a directory to mount one on",
	"host-proc-sys":           "an absolute path to a /proc/sys (holding net/ipv4/ip_local_port_range and ip_local_reserved_ports)",
	"metrics-bind-address":    "IP:PORT, localhost:PORT or :PORT, not a port --healthz-bind-address takes on the same address (localhost: 127.0.0.1; :PORT, 0.0.0.0 or [::]: all); empty turns it off",
	"healthz-bind-address":    "IP:PORT, localhost:PORT or :PORT, not a port --metrics-bind-address takes on the same address (localhost: 127.0.0.1; :PORT, 0.0.0.0 or [::]: all); empty turns it off",
	"service-proxy-name":      "a label value: up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit; or empty",
	"pod-interfaces":          "comma-separated interface name patterns (*, ?, [...])",
	"cgroup-root":             "auto, off, or an absolute path to a directory (not a file) of the cgroup v2 hierarchy",
	"min-sync-period":         "0 to 30s, at most --sync-period " + goDuration,
	"sync-period":             "1s to 24h " + goDuration,
	"log-level":               "debug, info, warn, error",
	"log-format":              "text, json",

	// Introspection commands.
	"output":  "table, json",
	"proto":   "tcp, udp",
	"src":     "IPv4:PORT",
	"dst":     "IPv4:PORT",
	"client":  "an IPv4 address",
	"backend": "an IPv4 address",
	"service": "a service port key (namespace/name:port/PROTO) or a prefix of one (namespace/name)",
}

// flagError is an invalid flag value: exit code 2, and a message naming
// the flag, the value, what is wrong and the allowed values.
func flagError(name string, value any, problem string) error {
	v := fmt.Sprint(value)
	if s, ok := value.(string); ok {
		v = fmt.Sprintf("%q", s)
	}
	return flagMessage(fmt.Sprintf("--%s %s: %s", name, v, problem), name)
}

// missingFlag is a required flag without a value: exit code 2.
func missingFlag(name string) error {
	return flagMessage(fmt.Sprintf("--%s is required", name), name)
}

func flagMessage(msg, name string) error {
	if a := allowed[name]; a != "" {
		msg += "; allowed values: " + a
	}
	return usageError("%s", msg)
}

// Usage errors as the flag package and urfave/cli word them.
var (
	reBadValue  = regexp.MustCompile(`^invalid value "(.*)" for flag -+([\w-]+): (.*)$`)
	reBadEnv    = regexp.MustCompile(`^could not parse "(.*)" (?:as [\w ]+ value )?from environment variable "(\w+)" (?:as value )?for flag ([\w-]+): (.*)$`)
	reUndefined = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	reNoValue   = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
)

// onUsageError turns the flag parser's errors (a flag that does not exist,
// a value that does not parse, from the command line or the environment)
// into exit code 2 with a message in the words of flagError.
func onUsageError(c *cli.Context, err error, _ bool) error {
	cmd, help := "xdplb", "xdplb --help"
	var flags []cli.Flag
	if c.Command != nil && c.Command.Name != "" && c.Command.Name != c.App.Name {
		cmd, help = c.Command.Name, "xdplb "+c.Command.Name+" --help"
		flags = c.Command.Flags
	} else {
		flags = c.App.Flags
	}
	msg := err.Error()
	if m := reBadValue.FindStringSubmatch(msg); m != nil {
		return flagError(m[2], m[1], parseProblem(flags, m[2], m[3]))
	}
	if m := reBadEnv.FindStringSubmatch(msg); m != nil {
		return flagError(m[3], m[1], fmt.Sprintf("(from $%s) %s", m[2], parseProblem(flags, m[3], m[4])))
	}
	if m := reUndefined.FindStringSubmatch(msg); m != nil {
		if cmd == "xdplb" {
			// Every message starts with "xdplb: " already.
			return usageError("unknown flag --%s (see %s)", m[1], help)
		}
		return usageError("%s: unknown flag --%s (see %s)", cmd, m[1], help)
	}
	if m := reNoValue.FindStringSubmatch(msg); m != nil {
		name := strings.TrimLeft(m[1], "-")
		return flagMessage(fmt.Sprintf("--%s needs a value", name), name)
	}
	return usageError("%s: %v", cmd, err)
}

// parseProblem says why a value did not parse, from the flag's type.
func parseProblem(flags []cli.Flag, name, detail string) string {
	if strings.Contains(detail, "out of range") {
		return "out of range"
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n != name {
				continue
			}
			switch f.(type) {
			case *cli.UintFlag, *cli.Uint64Flag, *cli.IntFlag, *cli.Int64Flag:
				return "not a whole number"
			case *cli.DurationFlag:
				return "not a duration"
			case *cli.BoolFlag:
				return "not true or false"
			}
		}
	}
	return "cannot be parsed"
}

// writeFlagTable renders flags as a Markdown table for docs/running.md: name,
// environment variables, default, allowed values and meaning, all taken
// from the flag definitions.
func writeFlagTable(w io.Writer, flags []cli.Flag) error {
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	code := func(s string) string {
		if s == "" {
			return ""
		}
		return "`" + s + "`"
	}
	var errs []error
	fmt.Fprintln(w, "| flag | environment | default | allowed values | meaning |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, f := range flags {
		doc, ok := f.(cli.DocGenerationFlag)
		if !ok {
			errs = append(errs, fmt.Errorf("flag %v: no documentation", f.Names()))
			continue
		}
		name := f.Names()[0]
		var envs []string
		for _, e := range doc.GetEnvVars() {
			envs = append(envs, code(e))
		}
		def := strings.Trim(doc.GetDefaultText(), `"`)
		if def != "" && !strings.Contains(def, " ") {
			def = code(def)
		}
		if def == "" {
			def = "none"
		}
		a := allowed[name]
		if a == "" {
			errs = append(errs, fmt.Errorf("flag --%s: allowed values not documented", name))
		}
		fmt.Fprintf(w, "| `--%s` | %s | %s | %s | %s |\n", name, strings.Join(envs, ", "), cell(def), cell(a), cell(doc.GetUsage()))
	}
	return errors.Join(errs...)
}
