package loader

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// A start attaches a loaded datapath while an earlier one may still run
// on the maps the pins name. Until CommitPins, each attach records how to
// put back what it changes, so that a start that fails can leave every
// interface running the programs it ran, on the maps the pins still name.

// revertStep puts back one hook as an attach found it.
type revertStep struct {
	what    string        // the hook, for errors
	prev    *ebpf.Program // the program of ours it ran; nil: none
	putBack func() error
}

// CommitPins makes the pins name this datapath's maps: the replacements
// of resized maps take the place of the pinned ones, all of them or none
// (the error says which). Call it once every interface runs this
// datapath's programs: an earlier datapath that still runs elsewhere keeps
// the maps the pins named before. After it, Revert does nothing. Calling
// it again does nothing.
func (d *Datapath) CommitPins() error {
	if d.committed {
		return nil
	}
	if d.replacements == nil {
		return errors.New("commit pins: the datapath is closed")
	}
	if err := d.replacements.commit(); err != nil {
		return err
	}
	d.committed = true
	d.replacements.Close()
	d.replacements = nil
	d.forgetRevertSteps()
	unpinRetiredMaps(mapsDir(d.opts.PinRoot), d.log)
	return nil
}

// Revert puts back what the attaches changed since Load, for a start that
// fails before CommitPins, latest first: a hook that ran an earlier program
// of ours runs it again (a pinned link updated in place gets it back; one
// that was detached or moved to another XDP mode is attached again as it
// was), and a hook that ran none is detached. The configuration the load
// overwrote is written back. The map pins are not touched. Close the datapath
// afterwards. An error names what could not be put back.
func (d *Datapath) Revert() error {
	if d.committed {
		return nil
	}
	var errs []error
	for i := len(d.revertSteps) - 1; i >= 0; i-- {
		if err := d.revertSteps[i].putBack(); err != nil {
			errs = append(errs, fmt.Errorf("put back %s: %w", d.revertSteps[i].what, err))
		}
	}
	d.forgetRevertSteps()
	if err := d.Maps.Config.Put(uint32(0), d.earlierConfig); err != nil {
		errs = append(errs, fmt.Errorf("put back the datapath config: %w", err))
	}
	return errors.Join(errs...)
}

// onRevert records how to put a hook back, unless the pins are
// committed; prev, the program the hook ran, is closed with the record.
func (d *Datapath) onRevert(what string, prev *ebpf.Program, putBack func() error) {
	if d.committed {
		if prev != nil {
			prev.Close()
		}
		return
	}
	d.revertSteps = append(d.revertSteps, revertStep{what: what, prev: prev, putBack: putBack})
}

// recording reports whether attaches record what they change.
func (d *Datapath) recording() bool { return !d.committed }

// forgetRevertSteps drops the records, closing the programs they held.
func (d *Datapath) forgetRevertSteps() {
	for _, s := range d.revertSteps {
		if s.prev != nil {
			s.prev.Close()
		}
	}
	d.revertSteps = nil
}

// linkProgram opens the program a link runs.
func linkProgram(l link.Link) (*ebpf.Program, error) {
	info, err := l.Info()
	if err != nil {
		return nil, fmt.Errorf("link info: %w", err)
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return nil, fmt.Errorf("open program %d: %w", info.Program, err)
	}
	return prog, nil
}

// updatePinnedLink makes the link pinned at path run prog.
func updatePinnedLink(path string, prog *ebpf.Program) error {
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return fmt.Errorf("open pinned link %s: %w", path, err)
	}
	defer l.Close()
	if err := l.Update(prog); err != nil {
		return fmt.Errorf("update pinned link %s: %w", path, err)
	}
	return nil
}
