package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/xdp"
)

// PutServiceName records the key of a service port id for introspection.
func (d *Dataplane) PutServiceName(id uint32, key string) error {
	if err := d.m.SvcNames.Put(id, serviceName(key)); err != nil {
		return fmt.Errorf("name service %d: %w", id, err)
	}
	return nil
}

// PutServiceNames records the keys of many service port ids (batched).
func (d *Dataplane) PutServiceNames(names map[uint32]string) error {
	keys := make([]uint32, 0, len(names))
	vals := make([]xdp.SvcName, 0, len(names))
	for id, key := range names {
		keys = append(keys, id)
		vals = append(vals, serviceName(key))
	}
	for start := 0; start < len(keys); start += batchChunk {
		end := min(start+batchChunk, len(keys))
		if _, err := d.m.SvcNames.BatchUpdate(keys[start:end], vals[start:end], nil); err != nil {
			return fmt.Errorf("name %d services: %w", end-start, err)
		}
	}
	return nil
}

func serviceName(key string) xdp.SvcName {
	var v xdp.SvcName
	if len(key) >= len(v.Key) {
		key = key[:len(v.Key)-1]
	}
	for i := 0; i < len(key); i++ {
		v.Key[i] = int8(key[i])
	}
	return v
}

// DeleteServiceName forgets the name of a service port id.
func (d *Dataplane) DeleteServiceName(id uint32) error {
	if err := d.m.SvcNames.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unname service %d: %w", id, err)
	}
	return nil
}

// ServiceNames returns the recorded service port keys by id. The map is
// read in batches: one syscall per few thousand names instead of two per
// name.
func (d *Dataplane) ServiceNames() (map[uint32]string, error) {
	out := map[uint32]string{}
	keys := make([]uint32, batchChunk)
	vals := make([]xdp.SvcName, batchChunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := d.m.SvcNames.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			out[keys[i]] = nameOf(vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read service names: %w", err)
		}
	}
}

// nameOf is the key a name entry holds: its bytes up to the first NUL.
func nameOf(v xdp.SvcName) string {
	b := make([]byte, 0, len(v.Key))
	for _, c := range v.Key {
		b = append(b, byte(c))
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// AgentState is what the agent records about itself after every sync.
type AgentState struct {
	LastSync     time.Time
	Started      time.Time
	Syncs        uint64
	PID          uint32
	PIDNamespace uint32 // inode of the namespace PID is in; 0 if not recorded
	ServicePorts uint32
	Problems     uint32
}

// PIDNamespaceOf returns the inode of the pid namespace of process pid, a
// number or "self" as in /proc, 0 if it cannot be read.
func PIDNamespaceOf(pid string) uint32 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+pid+"/ns/pid", &st); err != nil {
		return 0
	}
	return uint32(st.Ino)
}

// PutAgentState records the agent's state.
func (d *Dataplane) PutAgentState(s AgentState) error {
	v := xdp.AgentState{
		Syncs: s.Syncs, Pid: s.PID, PidNs: s.PIDNamespace, ServicePorts: s.ServicePorts, Problems: s.Problems,
	}
	if !s.LastSync.IsZero() {
		v.LastSyncUnixNs = uint64(s.LastSync.UnixNano())
	}
	if !s.Started.IsZero() {
		v.StartedUnixNs = uint64(s.Started.UnixNano())
	}
	if err := d.m.AgentState.Put(uint32(0), v); err != nil {
		return fmt.Errorf("record agent state: %w", err)
	}
	return nil
}

// AgentState reads what the agent recorded last.
func (d *Dataplane) AgentState() (AgentState, error) {
	var v xdp.AgentState
	if err := d.m.AgentState.Lookup(uint32(0), &v); err != nil {
		return AgentState{}, fmt.Errorf("read agent state: %w", err)
	}
	s := AgentState{Syncs: v.Syncs, PID: v.Pid, PIDNamespace: v.PidNs, ServicePorts: v.ServicePorts, Problems: v.Problems}
	if v.LastSyncUnixNs != 0 {
		s.LastSync = time.Unix(0, int64(v.LastSyncUnixNs))
	}
	if v.StartedUnixNs != 0 {
		s.Started = time.Unix(0, int64(v.StartedUnixNs))
	}
	return s, nil
}
