package suite

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/xdplb/xdplb/tests/netns"
)

// netfilterState is what the edge node's netfilter holds, as nft lists it:
// iptables-nft's tables (ip and ip6 filter, nat, mangle, raw) are nft
// tables too. The zero value is a namespace with no rules at all, which is
// what a new one starts with.
//
// Every table costs forwarded packets something even when it holds no
// rule: each base chain (iptables-nft creates the table's built-in chains)
// is a hook every packet passes, and a nat table makes the kernel track
// connections. kube-proxy --cleanup removes its rules and chains but keeps
// the tables: left over from the iptables mode, they slowed the nftables
// mode measured after it by 6-9%. So modes leave netfilter as it was.
type netfilterState struct {
	ruleset string   // nft list ruleset
	tables  []string // "family name" of each table
}

// readNetfilter reads the state of ns's netfilter.
func readNetfilter(ns *netns.NS) (netfilterState, error) {
	var s netfilterState
	out, err := ns.Exec("nft", "list", "ruleset")
	if err != nil {
		return s, fmt.Errorf("list the nftables ruleset: %w", err)
	}
	s.ruleset = strings.TrimSpace(out)
	out, err = ns.Exec("nft", "list", "tables")
	if err != nil {
		return s, fmt.Errorf("list the nftables tables: %w", err)
	}
	s.tables = parseNftTables(out)
	return s, nil
}

// parseNftTables returns "family name" for each line "table family name"
// of nft list tables.
func parseNftTables(out string) []string {
	var tables []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "table" {
			tables = append(tables, f[1]+" "+f[2])
		}
	}
	return tables
}

// restoreNetfilter deletes, in one transaction, every table of ns that was
// not there in before: the tables iptables(-nft) made for kube-proxy's
// rules and kept after they were removed. A table that was there before
// stays as it is (checkNetfilter says if it changed).
func restoreNetfilter(ns *netns.NS, before netfilterState) error {
	now, err := readNetfilter(ns)
	if err != nil {
		return err
	}
	var script strings.Builder
	for _, t := range now.tables {
		if !slices.Contains(before.tables, t) {
			fmt.Fprintf(&script, "delete table %s\n", t)
		}
	}
	if script.Len() == 0 {
		return nil
	}
	cmd := ns.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script.String())
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("delete the nftables tables left behind (%s): %w: %s",
			strings.Join(strings.Split(strings.TrimSpace(script.String()), "\n"), "; "), err, strings.TrimSpace(string(b)))
	}
	return nil
}

// checkNetfilter returns an error unless ns's netfilter is exactly as in
// before, or if it cannot be read.
func checkNetfilter(ns *netns.NS, before netfilterState) error {
	now, err := readNetfilter(ns)
	if err != nil {
		return err
	}
	if now.ruleset == before.ruleset {
		return nil
	}
	var added []string
	for _, t := range now.tables {
		if !slices.Contains(before.tables, t) {
			added = append(added, t)
		}
	}
	if len(added) > 0 {
		return fmt.Errorf("netfilter has tables it did not have before: %s", strings.Join(added, ", "))
	}
	return fmt.Errorf("netfilter's ruleset changed:\n%s", firstLines(now.ruleset, 20))
}

// iptablesUnavailable says why kube-proxy's iptables-based modes (iptables
// and IPVS, which uses iptables too) cannot leave the edge node as they
// found it, or "".
func iptablesUnavailable(ns *netns.NS) string {
	out, err := ns.Exec("iptables", "--version")
	if err != nil {
		return "iptables --version failed: " + err.Error()
	}
	if strings.Contains(out, "legacy") {
		return "iptables is the legacy (x_tables) variant: the tables kube-proxy makes with it cannot be removed from the edge node again and would slow down every mode measured after it (select iptables-nft: update-alternatives --set iptables /usr/sbin/iptables-nft)"
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return "nft is not installed (Debian package nftables): it removes the tables iptables leaves in the edge node"
	}
	return ""
}

// firstLines returns up to n lines of s.
func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append(lines[:n], fmt.Sprintf("... (%d lines more)", len(lines)-n))
	}
	return strings.Join(lines, "\n")
}
