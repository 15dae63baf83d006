package source

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xdplb/xdplb/control/model"
)

// Defaults of the file source.
const (
	// DefaultPollInterval is how often the file is checked for changes
	// that were not noticed through inotify.
	DefaultPollInterval = 5 * time.Second
	// DefaultDebounce is how long a burst of file system events is
	// collected before the file is read.
	DefaultDebounce = 50 * time.Millisecond
	// MaxFileSize is the largest services file read.
	MaxFileSize = 128 << 20
)

// writeGrace is how long a write seen in progress (a modification without
// a close yet) holds back reloads that are not triggered by the writer
// finishing. It only matters for writers that never close the file.
const writeGrace = time.Minute

// FileOption configures a File.
type FileOption func(*File)

// WithProxyName makes the file source keep only the objects that the proxy
// with this service-proxy-name handles (see model.Selected). The default
// is "", the default proxy.
func WithProxyName(name string) FileOption {
	return func(f *File) { f.proxyName = name }
}

// WithPollInterval sets how often the file is checked without an inotify
// event (DefaultPollInterval when d <= 0).
func WithPollInterval(d time.Duration) FileOption {
	return func(f *File) {
		if d > 0 {
			f.pollInterval = d
		}
	}
}

// WithDebounce sets how long bursts of file system events are collected
// before the file is read (DefaultDebounce when d <= 0).
func WithDebounce(d time.Duration) FileOption {
	return func(f *File) {
		if d > 0 {
			f.debounce = d
		}
	}
}

// File is a Source reading a services file in the format of ParseObjects.
//
// The file's directory is watched with inotify, so writes in place,
// replacements by rename and, when the path is a symlink, swaps of the
// links (as in Kubernetes ConfigMap volumes) are noticed; the file is also
// checked every poll interval. A version of the file that cannot be read
// or parsed, and a missing file, never replace the last good version: they
// show in Status().Err until a good version appears. To remove every
// service, write a file without objects rather than deleting it.
//
// Writers should replace the file atomically (write a temporary file in the
// same directory, then rename it). A write in place is picked up when the
// writer closes the file.
//
// Objects that model.Selected rejects for the configured proxy name are
// left out of the snapshot, as the Kubernetes source does. Node is always
// nil.
type File struct {
	path         string
	log          *slog.Logger
	proxyName    string
	pollInterval time.Duration
	debounce     time.Duration
	running      atomic.Bool

	mu     sync.Mutex
	snap   Snapshot
	status Status

	// Owned by the Run goroutine.
	loaded     stamp    // the file as last read
	loadedHash [32]byte // hash of the bytes last read
	haveHash   bool     // loadedHash is valid
	polled     stamp    // the file at the previous check
	// afterReload, when set, is called after each attempt to read the
	// file.
	afterReload func()
	// noWatch turns inotify off, leaving the periodic check.
	noWatch bool
}

var _ Source = (*File)(nil)

// NewFile returns a source reading the services file at path. A nil log
// discards messages.
func NewFile(path string, log *slog.Logger, opts ...FileOption) *File {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &File{
		path:         filepath.Clean(path),
		log:          log.With("file", path),
		pollInterval: DefaultPollInterval,
		debounce:     DefaultDebounce,
	}
	for _, o := range opts {
		o(f)
	}
	return f
}

// Snapshot returns the last good version of the file, filtered by proxy
// name and sorted by namespace and name. It is empty until the file has
// been read successfully once.
func (f *File) Snapshot() Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

// Status returns the source's health. Synced is set once the file has been
// read successfully; Err holds the reason the current version of the file
// is not in use (unreadable, missing or invalid).
func (f *File) Status() Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}

// Run reads the file and watches it until ctx is done. It returns an error
// only when the file's directory does not exist or Run is already running;
// a missing or invalid file is reported through Status and picked up once
// it is fixed.
func (f *File) Run(ctx context.Context, changed func()) error {
	if changed == nil {
		changed = func() {}
	}
	if !f.running.CompareAndSwap(false, true) {
		return errors.New("services file source: Run called while running")
	}
	defer f.running.Store(false)

	dir := filepath.Dir(f.path)
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("services file directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("services file directory %s: not a directory", dir)
	}

	// A nil watcher does nothing: the file is then only polled.
	var w *watcher
	var events <-chan []fsEvent
	if !f.noWatch {
		w, err = newWatcher(f.path, f.log)
		if err != nil {
			f.log.Warn("cannot watch the services file for changes; checking it periodically only",
				"err", err, "interval", f.pollInterval)
		} else {
			defer w.close()
			events = w.events
		}
	}

	w.sync()
	f.reload(changed)

	poll := time.NewTicker(f.pollInterval)
	defer poll.Stop()
	debounce := time.NewTimer(f.debounce)
	debounce.Stop()
	defer debounce.Stop()
	pending := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case evs, ok := <-events:
			if !ok {
				f.log.Warn("watching the services file failed; checking it periodically only",
					"err", w.err, "interval", f.pollInterval)
				events = nil
				continue
			}
			if w.classify(evs, time.Now()) && !pending {
				pending = true
				debounce.Reset(f.debounce)
			}
		case <-debounce.C:
			pending = false
			if w.writing(time.Now()) {
				// A writer has the file open; its close triggers the
				// reload.
				continue
			}
			f.reload(changed)
			w.sync()
		case <-poll.C:
			f.poll(changed, w)
			w.sync()
		}
	}
}

// poll reloads the file when it has changed and then stayed the same for a
// poll interval, so that a write in progress is not read half-way.
func (f *File) poll(changed func(), w *watcher) {
	st := statFile(f.path)
	prev := f.polled
	f.polled = st
	if st == f.loaded || st != prev || w.writing(time.Now()) {
		return
	}
	f.reload(changed)
}

// reload reads and parses the file and updates the snapshot and status.
func (f *File) reload(changed func()) {
	if f.afterReload != nil {
		defer f.afterReload()
	}
	data, st, err := readFile(f.path)
	if err != nil {
		f.loaded, f.polled, f.haveHash = st, st, false
		f.fail(fmt.Errorf("read services file: %w", err))
		return
	}
	f.loaded, f.polled = st, st
	sum := sha256.Sum256(data)
	if f.haveHash && sum == f.loadedHash {
		return // the same bytes as last time: the same outcome
	}
	f.loadedHash, f.haveHash = sum, true

	svcs, slices, err := ParseObjects(f.path, data)
	if err != nil {
		f.fail(err)
		return
	}
	if err := versionByContent(svcs, slices); err != nil {
		f.fail(err)
		return
	}
	snap, skipped := selectObjects(svcs, slices, f.proxyName)
	for _, s := range snap.Slices {
		if s.Labels[discoveryv1.LabelServiceName] == "" {
			f.log.Warn("EndpointSlice without the service-name label belongs to no Service",
				"slice", s.Namespace+"/"+s.Name, "label", discoveryv1.LabelServiceName)
		}
	}

	now := time.Now()
	f.mu.Lock()
	first := !f.status.Synced
	same := !first &&
		equality.Semantic.DeepEqual(f.snap.Services, snap.Services) &&
		equality.Semantic.DeepEqual(f.snap.Slices, snap.Slices)
	if !same {
		f.snap = snap
		f.status.LastChange = now
	}
	recovered := f.status.Err != nil
	f.status.Synced = true
	f.status.Err = nil
	f.status.ErrSince = time.Time{}
	f.mu.Unlock()

	if recovered {
		f.log.Info("services file is usable again")
	}
	if !same {
		f.log.Info("services file loaded", "services", len(snap.Services), "slices", len(snap.Slices),
			"skipped", skipped)
		changed()
	}
}

// fail records a problem with the current version of the file.
func (f *File) fail(err error) {
	f.mu.Lock()
	prev := f.status.Err
	if prev == nil {
		f.status.ErrSince = time.Now()
	}
	f.status.Err = err
	synced := f.status.Synced
	f.mu.Unlock()
	if prev == nil || prev.Error() != err.Error() {
		if synced {
			f.log.Warn("services file unusable; keeping its last good version", "err", err)
		} else {
			f.log.Warn("services file unusable", "err", err)
		}
	}
}

// readFile reads the file at path, and describes the version read.
func readFile(path string) ([]byte, stamp, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, statFile(path), err
	}
	defer fd.Close()
	fi, err := fd.Stat()
	if err != nil {
		return nil, stamp{}, err
	}
	st := stampOf(fi)
	if !fi.Mode().IsRegular() {
		return nil, st, fmt.Errorf("%s: not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(fd, MaxFileSize+1))
	if err != nil {
		return nil, st, err
	}
	if len(data) > MaxFileSize {
		return nil, st, fmt.Errorf("%s: larger than %d bytes", path, MaxFileSize)
	}
	return data, st, nil
}

// statFile describes the file at path; the zero stamp when it cannot be
// examined.
func statFile(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}
	}
	return stampOf(fi)
}

// versionByContent replaces every object's resourceVersion with a digest of
// its content. Files are often made from `kubectl get -o yaml` output and
// then edited by hand without touching metadata.resourceVersion; consumers
// (the incremental model) take an unchanged resourceVersion to mean an
// unchanged object, as it does in the API server.
func versionByContent(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) error {
	objs := make([]metav1.Object, 0, len(svcs)+len(slices))
	for _, s := range svcs {
		objs = append(objs, s)
	}
	for _, s := range slices {
		objs = append(objs, s)
	}
	for _, obj := range objs {
		obj.SetResourceVersion("")
		content, err := json.Marshal(obj)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
		}
		sum := sha256.Sum256(content)
		obj.SetResourceVersion("file-" + hex.EncodeToString(sum[:12]))
	}
	return nil
}

// selectObjects keeps the objects the proxy handles, sorted by namespace
// and name, and counts the others.
func selectObjects(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice, proxyName string) (Snapshot, int) {
	var snap Snapshot
	skipped := 0
	for _, s := range svcs {
		if model.Selected(s.Labels, proxyName) {
			snap.Services = append(snap.Services, s)
		} else {
			skipped++
		}
	}
	for _, s := range slices {
		if model.Selected(s.Labels, proxyName) {
			snap.Slices = append(snap.Slices, s)
		} else {
			skipped++
		}
	}
	sortObjects(snap.Services)
	sortObjects(snap.Slices)
	return snap, skipped
}
