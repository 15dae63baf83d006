package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// ForeignAttachments lists the pinned XDP and TC attachments that run a
// program other than this datapath's: ones an earlier agent attached and
// nothing has replaced (an interface no longer in --iface that the agent
// failed to detach, a pod interface whose update failed). Such a program may act on the shared
// maps by the rules of an older version. (TC filters attached through
// clsact, on kernels without tcx, are not links and are not listed.)
func (d *Datapath) ForeignAttachments() ([]string, error) {
	ours := map[ebpf.ProgramID]bool{}
	for _, p := range []*ebpf.Program{d.nic, d.nicIngress, d.pod, d.hostReply} {
		info, err := p.Info()
		if err != nil {
			return nil, fmt.Errorf("program info: %w", err)
		}
		id, ok := info.ID()
		if !ok {
			return nil, errors.New("program info: no program id (kernel too old)")
		}
		ours[id] = true
	}
	dir := linksDir(d.opts.PinRoot)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var foreign []string
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "xdp-") && !strings.HasPrefix(name, "tc-") {
			continue
		}
		l, err := link.LoadPinnedLink(filepath.Join(dir, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue // forgotten meanwhile (a pod interface went away)
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned link %s: %w", name, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			return nil, fmt.Errorf("pinned link %s: %w", name, err)
		}
		if !ours[info.Program] {
			foreign = append(foreign, name)
		}
	}
	return foreign, nil
}
