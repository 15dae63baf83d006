package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// TestSNATPortReservations runs reservations and releases in a fresh
// network namespace (ip_local_reserved_ports is per namespace, so the
// host's is never touched) and checks what the kernel ends up with: the
// agent adds its range, replaces it when the range changes, keeps it
// across restarts (the record is pinned), and releases only the ports it
// added itself, never those reserved before it.
func TestSNATPortReservations(t *testing.T) {
	type step struct {
		lo, hi uint16
		want   string // ip_local_reserved_ports after the step
	}
	// portsOf is a step's SNAT ports: lo 0 for the default ones.
	portsOf := func(s step) xdp.SNATPorts {
		if s.lo == 0 {
			return loader.DefaultSNATPorts
		}
		return xdp.SNATPorts{{Min: s.lo, Max: s.hi}}
	}
	for _, tc := range []struct {
		name      string
		portRange string // ip_local_port_range; "" for the namespace's default, 32768 60999
		before    string // reserved before the agent's first start
		starts    []step
		released  string // after ReleaseSNATPorts
	}{
		{name: "fresh", starts: []step{{40000, 60999, "40000-60999"}}, released: ""},
		{name: "default ports: those within the ephemeral range", starts: []step{{0, 0, "40000-60999"}}, released: ""},
		{name: "default ports, the ephemeral range wider", portRange: "1024 65535",
			starts: []step{{0, 0, "1024-29999,40000-65535"}}, released: ""},
		{name: "restart keeps the range", starts: []step{{40000, 60999, "40000-60999"}, {40000, 60999, "40000-60999"}}, released: ""},
		{name: "changed range replaces the old one",
			starts:   []step{{40000, 60999, "40000-60999"}, {45000, 50000, "45000-50000"}},
			released: ""},
		{name: "reserved by others before are kept",
			before:   "8080,41000-41010,59000",
			starts:   []step{{40000, 60999, "8080,40000-60999"}, {45000, 50000, "8080,41000-41010,45000-50000,59000"}},
			released: "8080,41000-41010,59000"},
		{name: "range already reserved: nothing is the agent's",
			before:   "40000-60999",
			starts:   []step{{40000, 60999, "40000-60999"}, {42000, 43000, "40000-60999"}},
			released: "40000-60999"},
		{name: "range outside the ephemeral ports releases the old one",
			portRange: "32768 50000",
			starts:    []step{{40000, 49000, "40000-49000"}, {55000, 60000, ""}},
			released:  ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testenv.NewNetns(t, "rsv")
			root := testenv.BPFFS(t)
			log := slog.New(slog.DiscardHandler)
			if tc.portRange != "" {
				ns.Sysctl("net.ipv4.ip_local_port_range", tc.portRange)
			}
			if tc.before != "" {
				ns.Sysctl("net.ipv4.ip_local_reserved_ports", tc.before)
			}
			reserved := func() string {
				raw, err := os.ReadFile(ProcSys("").localReservedPorts())
				if err != nil {
					t.Fatal(err)
				}
				return strings.TrimSpace(string(raw))
			}
			err := ns.Do(func() error {
				for i, s := range tc.starts {
					if err := ProcSys("").CheckSNATRange(portsOf(s)); err != nil {
						t.Fatalf("start %d (%d-%d): %v", i, s.lo, s.hi, err)
					}
					if _, err := reserveSNATPorts(root, "", portsOf(s), log); err != nil {
						t.Fatalf("start %d (%d-%d): %v", i, s.lo, s.hi, err)
					}
					if got := reserved(); got != s.want {
						t.Errorf("after start %d (%d-%d): reserved %q, want %q", i, s.lo, s.hi, got, s.want)
					}
				}
				if _, err := ReleaseSNATPorts(root, ""); err != nil {
					t.Fatalf("release: %v", err)
				}
				if got := reserved(); got != tc.released {
					t.Errorf("after release: reserved %q, want %q", got, tc.released)
				}
				// Released twice (a second detach): nothing more goes.
				if ports, err := ReleaseSNATPorts(root, ""); err != nil || ports != "" {
					t.Fatalf("second release: released %q, %v; want nothing", ports, err)
				}
				if got := reserved(); got != tc.released {
					t.Errorf("after a second release: reserved %q, want %q", got, tc.released)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A failed start gives back the SNAT ports it reserved when no datapath is
// left to use them; with an earlier agent's datapath attached, whose
// configuration it puts back, the range that datapath translates to stays
// reserved, also when the failed start had another.
func TestFailedStartReleasesSNATPortsOnlyWhenFresh(t *testing.T) {
	for _, c := range []struct {
		name         string
		earlier      bool   // an agent started (and stopped) on the pins first, with the default range
		snatRange    string // of the failing start: LOW-HIGH
		wantReserved string
	}{
		{"fresh start", false, "40000-60999", ""},
		{"earlier datapath attached", true, "40000-60999", "40000-60999"},
		{"earlier datapath attached, range changed", true, "35000-45000", "40000-60999"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns := testenv.NewNetns(t, "rsvfail")
			ns.IP("link", "add", "edge0", "type", "veth", "peer", "name", "edge1")
			ns.IP("link", "set", "edge0", "up")
			ns.IP("link", "set", "edge1", "up")
			cfg := fileConfig(t, "edge0")
			opts := cfg.Datapath
			var reserved string
			err := ns.Do(func() error {
				if c.earlier {
					a, err := Start(context.Background(), cfg, discard())
					if err != nil {
						return fmt.Errorf("earlier agent: %w", err)
					}
					a.Close()
				}
				failing := cfg
				failing.CgroupRoot = t.TempDir() // no cgroup v2: fails after the reservation
				ports, err := xdp.ParseSNATPorts(c.snatRange)
				if err != nil {
					return err
				}
				failing.Datapath.SNATPorts = ports
				if a, err := Start(context.Background(), failing, discard()); err == nil {
					a.Close()
					return errors.New("Start succeeded")
				}
				raw, err := os.ReadFile(ProcSys("").localReservedPorts())
				reserved = strings.TrimSpace(string(raw))
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if reserved != c.wantReserved {
				t.Errorf("after the failed start: ip_local_reserved_ports %q, want %q", reserved, c.wantReserved)
			}
			if c.earlier {
				// The range the earlier datapath translates to.
				m, err := loader.OpenPinned(opts.PinRoot)
				if err != nil {
					t.Fatal(err)
				}
				var dc xdp.DatapathConfig
				err = m.Config.Lookup(uint32(0), &dc)
				m.Close()
				if err != nil || xdp.SNATPortsOf(&dc) != opts.SNATPorts {
					t.Errorf("after the failed start the datapath translates to ports %s (%v), want %s",
						xdp.SNATPortsOf(&dc), err, opts.SNATPorts)
				}
			}
			// The record agrees: a later detach releases what is reserved.
			rec, err := loadReservedRecord(opts.PinRoot)
			if err != nil {
				t.Fatal(err)
			}
			if got := rec.String(); got != c.wantReserved {
				t.Errorf("record of reserved ports %q, want %q", got, c.wantReserved)
			}
		})
	}
}

// In a container /proc/sys is read-only; deploy/daemonset.yaml mounts the
// node's /proc/sys/net elsewhere and names it with --host-proc-sys. The
// test builds that view in a mount namespace of its own: through the
// read-only /proc/sys the reservation fails (the agent warns and goes on),
// through the other mount it lands in the network namespace's
// ip_local_reserved_ports, and the release goes the same way.
func TestSNATPortsReservedThroughHostProcSys(t *testing.T) {
	ns := testenv.NewNetns(t, "rsvhost")
	root := testenv.BPFFS(t)
	host := t.TempDir()
	var viaReadOnly, viaHost, released, releasedPorts string
	err := ns.Do(func() error {
		// Never unlocked: the thread ends with its mount namespace.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("unshare the mount namespace: %w", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make mounts private: %w", err)
		}
		if err := os.MkdirAll(filepath.Join(host, "net"), 0o755); err != nil {
			return err
		}
		if err := unix.Mount("/proc/sys/net", filepath.Join(host, "net"), "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind the node's /proc/sys/net: %w", err)
		}
		if err := unix.Mount("/proc/sys", "/proc/sys", "", unix.MS_BIND, ""); err != nil {
			return err
		}
		if err := unix.Mount("", "/proc/sys", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make /proc/sys read-only: %w", err)
		}
		read := func() string {
			raw, err := os.ReadFile(ProcSys("").localReservedPorts())
			if err != nil {
				t.Error(err)
			}
			return strings.TrimSpace(string(raw))
		}
		log := slog.New(slog.DiscardHandler)
		if err := ProcSys(host).Check(); err != nil {
			return err
		}
		if _, err := reserveSNATPorts(root, "", xdp.SNATPorts{{Min: 40000, Max: 60999}}, log); err != nil {
			return fmt.Errorf("through the read-only /proc/sys: %w", err)
		}
		viaReadOnly = read()
		if _, err := reserveSNATPorts(root, ProcSys(host), xdp.SNATPorts{{Min: 40000, Max: 60999}}, log); err != nil {
			return fmt.Errorf("through %s: %w", host, err)
		}
		viaHost = read()
		var err error
		releasedPorts, err = ReleaseSNATPorts(root, ProcSys(host))
		released = read()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if viaReadOnly != "" {
		t.Errorf("through the read-only /proc/sys: reserved %q, want nothing", viaReadOnly)
	}
	if viaHost != "40000-60999" {
		t.Errorf("through --host-proc-sys: reserved %q, want 40000-60999", viaHost)
	}
	if released != "" || releasedPorts != "40000-60999" {
		t.Errorf("after the release: reserved %q (released %q), want nothing (40000-60999)", released, releasedPorts)
	}
}

func TestProcSysCheck(t *testing.T) {
	if err := ProcSys("").Check(); err != nil {
		t.Errorf("the process's own /proc/sys: %v", err)
	}
	if err := ProcSys(t.TempDir()).Check(); err == nil || !strings.Contains(err.Error(), "not a /proc/sys") {
		t.Errorf("an empty directory: %v, want not a /proc/sys", err)
	}
}
