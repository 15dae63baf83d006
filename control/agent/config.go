// Package agent runs xdplb on a node: it loads and attaches the datapath,
// watches the source of truth, and keeps the datapath maps in step with it
// in a sync loop, serving health and metrics meanwhile. Stopping the agent
// leaves the datapath attached and pinned, so a restart is hitless.
package agent

import (
	"net/netip"
	"time"

	"github.com/xdplb/xdplb/loader"
)

// Config is everything the agent needs, already validated (see
// cmd/xdplb for the flags that fill it).
type Config struct {
	Interfaces []string
	XDPMode    loader.XDPMode
	Datapath   loader.Options

	// Exactly one source: ServicesFile, or the Kubernetes API through
	// Kubeconfig (empty: in-cluster configuration).
	ServicesFile string
	Kubeconfig   string

	NodeName  string
	ProxyName string

	MaglevTableSize uint32
	MaglevSeed      uint64

	NodePortMin, NodePortMax uint16
	// NodePortAddresses restricts NodePort frontends: CIDRs filtering all
	// node addresses, or Primary for the node's primary address only.
	// Empty means the addresses of Interfaces.
	NodePortAddresses []netip.Prefix
	NodePortPrimary   bool

	MetricsAddress string // "" disables
	HealthzAddress string // "" disables

	// PodInterfaces is the name pattern of host-side pod interfaces.
	PodInterfaces string
	// CgroupRoot is the cgroup v2 directory whose processes (normally all:
	// the root) reach services through the socket programs; "" disables.
	CgroupRoot string
	// CgroupAuto records that CgroupRoot was looked for (and is "" when
	// none was found, which the agent reports).
	CgroupAuto bool

	// ProcSys is where the node's /proc/sys is reached, to reserve the
	// SNAT port range from the host's ephemeral ports.
	ProcSys ProcSys

	// MinSyncPeriod coalesces bursts of changes: syncs start at most this
	// often. SyncPeriod is the interval of a full resync without changes.
	MinSyncPeriod time.Duration
	SyncPeriod    time.Duration
	// HealthTimeout: /healthz fails when a change waits longer than this.
	HealthTimeout time.Duration
}
