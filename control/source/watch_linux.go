package source

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// stamp describes a version of a file cheaply: two equal stamps almost
// certainly mean the same content. The zero stamp stands for a file that
// does not exist or cannot be examined.
type stamp struct {
	dev, ino    uint64
	size        int64
	mtime, ctim int64
}

func stampOf(fi fs.FileInfo) stamp {
	st := stamp{size: fi.Size(), mtime: fi.ModTime().UnixNano(), ino: 1}
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.dev, st.ino = uint64(s.Dev), s.Ino
		st.ctim = s.Ctim.Nano()
	}
	return st
}

// dirMask is what the watched directories report.
const dirMask = unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_ATTRIB |
	unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// fsEvent is one inotify event.
type fsEvent struct {
	wd   int32
	mask uint32
	name string
}

// dirWatch is what matters in one watched directory.
type dirWatch struct {
	dir string
	// names are the entries whose every change matters: the file itself,
	// or the final target of the symlink the file is.
	names map[string]bool
	// links is set when the file is a symlink: then creating, removing
	// or renaming any entry of the directory may change where it points
	// (Kubernetes ConfigMap volumes swap a "..data" link).
	links bool
}

// watcher reports file system events that may change the file at path.
// Apart from its reading goroutine, it is used by one goroutine only.
type watcher struct {
	path string
	log  *slog.Logger
	f    *os.File
	raw  syscall.RawConn

	// events carries batches of events; it is closed when reading
	// fails (err says why) or after close.
	events chan []fsEvent
	err    error
	stop   chan struct{}
	done   chan struct{}

	watches      map[int32]*dirWatch
	writingSince time.Time // a write in place was seen and not yet closed
}

// newWatcher starts reading inotify events; sync sets up the watches.
func newWatcher(path string, log *slog.Logger) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	// A non-blocking descriptor goes to the runtime poller, so Read
	// blocks only its goroutine and Close interrupts it.
	f := os.NewFile(uintptr(fd), "inotify")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &watcher{
		path:    path,
		log:     log,
		f:       f,
		raw:     raw,
		events:  make(chan []fsEvent),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		watches: make(map[int32]*dirWatch),
	}
	go w.read()
	return w, nil
}

// close stops the reading goroutine and closes the inotify descriptor.
func (w *watcher) close() {
	close(w.stop)
	w.f.Close()
	<-w.done
}

func (w *watcher) read() {
	defer close(w.done)
	defer close(w.events)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				w.err = fmt.Errorf("read inotify events: %w", err)
			}
			return
		}
		evs := parseEvents(buf[:n])
		if len(evs) == 0 {
			continue
		}
		select {
		case w.events <- evs:
		case <-w.stop:
			return
		}
	}
}

func parseEvents(b []byte) []fsEvent {
	var evs []fsEvent
	for off := 0; off+unix.SizeofInotifyEvent <= len(b); {
		wd := int32(binary.NativeEndian.Uint32(b[off:]))
		mask := binary.NativeEndian.Uint32(b[off+4:])
		n := int(binary.NativeEndian.Uint32(b[off+12:]))
		start := off + unix.SizeofInotifyEvent
		if start+n > len(b) {
			break
		}
		name := string(bytes.TrimRight(b[start:start+n], "\x00"))
		evs = append(evs, fsEvent{wd: wd, mask: mask, name: name})
		off = start + n
	}
	return evs
}

// sync adjusts the watches to where the file is now: its directory, and
// when it is a symlink, also the directory of its final target.
func (w *watcher) sync() {
	if w == nil {
		return
	}
	want := make(map[string]*dirWatch)
	add := func(path string, links bool) {
		dir, name := filepath.Dir(path), filepath.Base(path)
		dw := want[dir]
		if dw == nil {
			dw = &dirWatch{dir: dir, names: make(map[string]bool)}
			want[dir] = dw
		}
		dw.names[name] = true
		dw.links = dw.links || links
	}
	fi, err := os.Lstat(w.path)
	isLink := err == nil && fi.Mode()&fs.ModeSymlink != 0
	add(w.path, isLink)
	if isLink {
		if target, err := filepath.EvalSymlinks(w.path); err == nil {
			add(target, false)
		}
	}

	next := make(map[int32]*dirWatch, len(want))
	for _, dw := range want {
		wd, err := w.addWatch(dw.dir)
		if err != nil {
			if !errors.Is(err, unix.ENOENT) {
				w.log.Debug("cannot watch directory", "dir", dw.dir, "err", err)
			}
			continue
		}
		if cur := next[wd]; cur != nil {
			// Two paths of the same directory.
			for n := range dw.names {
				cur.names[n] = true
			}
			cur.links = cur.links || dw.links
			continue
		}
		next[wd] = dw
	}
	for wd := range w.watches {
		if next[wd] == nil {
			w.rmWatch(wd)
		}
	}
	w.watches = next
}

func (w *watcher) addWatch(dir string) (int32, error) {
	var wd int
	var err error
	if cerr := w.raw.Control(func(fd uintptr) {
		wd, err = unix.InotifyAddWatch(int(fd), dir, dirMask)
	}); cerr != nil {
		return 0, cerr
	}
	if err != nil {
		return 0, fmt.Errorf("inotify_add_watch %s: %w", dir, err)
	}
	return int32(wd), nil
}

func (w *watcher) rmWatch(wd int32) {
	// The watch may be gone already with its directory.
	_ = w.raw.Control(func(fd uintptr) {
		_, _ = unix.InotifyRmWatch(int(fd), uint32(wd))
	})
}

// classify notes writes in progress and reports whether the events call
// for reading the file.
func (w *watcher) classify(evs []fsEvent, now time.Time) (reload bool) {
	for _, ev := range evs {
		if ev.mask&unix.IN_Q_OVERFLOW != 0 {
			// Events were lost.
			w.writingSince = time.Time{}
			reload = true
			continue
		}
		dw := w.watches[ev.wd]
		if dw == nil {
			continue
		}
		if ev.mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
			// The directory went away or moved; sync watches it again
			// when it is back.
			if ev.mask&unix.IN_IGNORED != 0 {
				delete(w.watches, ev.wd)
			}
			reload = true
			continue
		}
		if dw.names[ev.name] {
			switch {
			case ev.mask&unix.IN_MODIFY != 0:
				w.writingSince = now
			case ev.mask&unix.IN_CREATE != 0:
				if fi, err := os.Lstat(filepath.Join(dw.dir, ev.name)); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
					reload = true
				} else {
					// A new file is written now; its close (or
					// a rename onto it) follows.
					w.writingSince = now
				}
			case ev.mask&unix.IN_ATTRIB != 0:
				reload = true
			default: // closed after writing, renamed or removed
				w.writingSince = time.Time{}
				reload = true
			}
			continue
		}
		if dw.links && ev.mask&(unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO) != 0 {
			reload = true
		}
	}
	return reload
}

// writing reports whether a write in place is in progress.
func (w *watcher) writing(now time.Time) bool {
	return w != nil && !w.writingSince.IsZero() && now.Sub(w.writingSince) < writeGrace
}
