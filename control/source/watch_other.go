//go:build !linux

package source

import (
	"errors"
	"io/fs"
	"log/slog"
	"time"
)

// stamp describes a version of a file cheaply; the zero stamp stands for
// a file that does not exist or cannot be examined.
type stamp struct {
	size, mtime int64
	exists      bool
}

func stampOf(fi fs.FileInfo) stamp {
	return stamp{size: fi.Size(), mtime: fi.ModTime().UnixNano(), exists: true}
}

type fsEvent struct{}

// watcher is not available here: the file is polled.
type watcher struct {
	events chan []fsEvent
	err    error
}

func newWatcher(string, *slog.Logger) (*watcher, error) {
	return nil, errors.New("file system events are only watched on Linux")
}

func (w *watcher) close()                             {}
func (w *watcher) sync()                              {}
func (w *watcher) classify([]fsEvent, time.Time) bool { return false }
func (w *watcher) writing(time.Time) bool             { return false }
