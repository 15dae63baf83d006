// Pins live on a bpffs: ensureBPFFS finds or mounts one.

package loader

import (
	"fmt"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"
)

// ensureBPFFS makes sure root is on a bpffs, mounting one there if not.
// A bpffs mounted here is private to this mount namespace (a pod's, say):
// the pins go with it, so restarts and upgrades cannot adopt them, and it
// says so with a warning.
func ensureBPFFS(root string, log *slog.Logger) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("bpffs root %s: %w", root, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return fmt.Errorf("bpffs root %s: %w", root, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w (needs CAP_SYS_ADMIN, or mount it beforehand)", root, err)
	}
	log.Warn("no bpffs at the pin root: mounted a private one, whose pins do not outlive this mount namespace "+
		"(in a pod: the pod), so a restarted agent starts over with empty maps; mount bpffs there on the node",
		"path", root)
	return nil
}
