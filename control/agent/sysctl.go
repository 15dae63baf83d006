package agent

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

const (
	localPortRange    = "/proc/sys/net/ipv4/ip_local_port_range"
	localReservedPort = "/proc/sys/net/ipv4/ip_local_reserved_ports"
)

// minEphemeralPorts is how many ports of ip_local_port_range the SNAT
// range must leave to the host's own outgoing connections.
const minEphemeralPorts = 1024

// reserveSNATPorts keeps the host's own sockets out of the SNAT port
// range: if the range overlaps ip_local_port_range, it is added to
// ip_local_reserved_ports (keeping what is there), so no ephemeral port
// the kernel hands out can collide with a translated flow. A range that
// would leave the host fewer than minEphemeralPorts is refused: reserving
// it would make the host's connect() fail.
func reserveSNATPorts(lo, hi uint16, log *slog.Logger) error {
	raw, err := os.ReadFile(localPortRange)
	if err != nil {
		return fmt.Errorf("read %s: %w", localPortRange, err)
	}
	f := strings.Fields(string(raw))
	if len(f) != 2 {
		return fmt.Errorf("unexpected %s: %q", localPortRange, raw)
	}
	eLo, err1 := strconv.Atoi(f[0])
	eHi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return fmt.Errorf("unexpected %s: %q", localPortRange, raw)
	}
	if int(hi) < eLo || int(lo) > eHi {
		return nil // no overlap
	}
	overlap := min(int(hi), eHi) - max(int(lo), eLo) + 1
	if left := eHi - eLo + 1 - overlap; left < minEphemeralPorts {
		return fmt.Errorf("SNAT port range %d-%d would leave the host %d of its ephemeral ports "+
			"(ip_local_port_range %d-%d), fewer than %d: choose a range outside it or a smaller one",
			lo, hi, left, eLo, eHi, minEphemeralPorts)
	}
	cur, err := os.ReadFile(localReservedPort)
	if err != nil {
		return fmt.Errorf("read %s: %w", localReservedPort, err)
	}
	mine := fmt.Sprintf("%d-%d", lo, hi)
	have := strings.TrimSpace(string(cur))
	for _, r := range strings.Split(have, ",") {
		if r == mine {
			return nil
		}
	}
	next := mine
	if have != "" {
		next = have + "," + mine
	}
	if err := os.WriteFile(localReservedPort, []byte(next), 0o644); err != nil {
		// A container usually sees /proc/sys read-only: the node must
		// reserve the range itself (the README's node requirements).
		log.Warn("cannot reserve the SNAT port range from the host's ephemeral ports: "+
			"host connections may collide with translated flows", "ports", mine, "error", err)
		return nil
	}
	log.Info("SNAT ports reserved from the host's ephemeral range", "ports", mine,
		"ip_local_port_range", strings.TrimSpace(string(raw)))
	return nil
}
