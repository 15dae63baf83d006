//go:build linux

package source

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/xdplb/xdplb/control/model"
)

// serviceDoc is a Service document with one port.
func serviceDoc(name string, port int, labels ...string) string {
	var l string
	if len(labels) > 0 {
		l = "  labels:\n"
		for i := 0; i+1 < len(labels); i += 2 {
			l += fmt.Sprintf("    %s: %q\n", labels[i], labels[i+1])
		}
	}
	return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata:\n  name: %s\n%sspec:\n  ports:\n  - port: %d\n", name, l, port)
}

func sliceDoc(name, service string, labels ...string) string {
	l := fmt.Sprintf("    kubernetes.io/service-name: %s\n", service)
	for i := 0; i+1 < len(labels); i += 2 {
		l += fmt.Sprintf("    %s: %q\n", labels[i], labels[i+1])
	}
	return fmt.Sprintf("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s\n  labels:\n%saddressType: IPv4\nendpoints: []\n", name, l)
}

func stream(docs ...string) string {
	return strings.Join(docs, "---\n")
}

// writeAtomic replaces the file through a rename, as editors and
// configuration tools do.
func writeAtomic(t *testing.T, path, data string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func writeInPlace(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fileHarness runs a File and reports its callbacks on channels.
type fileHarness struct {
	t        *testing.T
	f        *File
	changed  chan struct{}
	reloaded chan struct{}
}

// newFileHarness starts a File on path; polling is off unless opts turn it
// on, so that changes must be noticed through inotify.
func newFileHarness(t *testing.T, path string, opts ...FileOption) *fileHarness {
	t.Helper()
	opts = append([]FileOption{WithPollInterval(time.Hour), WithDebounce(10 * time.Millisecond)}, opts...)
	h := &fileHarness{
		t:        t,
		f:        NewFile(path, testLogger(t), opts...),
		changed:  make(chan struct{}, 100),
		reloaded: make(chan struct{}, 100),
	}
	h.f.afterReload = func() { h.reloaded <- struct{}{} }
	return h
}

func (h *fileHarness) start() {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.f.Run(ctx, func() { h.changed <- struct{}{} }) }()
	h.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				h.t.Errorf("Run: %v", err)
			}
		case <-time.After(waitTimeout):
			h.t.Error("Run did not return after cancel")
		}
	})
}

// waitChanged waits for one call of changed.
func (h *fileHarness) waitChanged() {
	h.t.Helper()
	select {
	case <-h.changed:
	case <-time.After(waitTimeout):
		h.t.Fatal("changed was not called")
	}
}

// waitReload waits until a reload leaves cond true.
func (h *fileHarness) waitReload(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case <-h.reloaded:
			if cond() {
				return
			}
		case <-deadline:
			h.t.Fatalf("no reload made %s true", what)
		}
	}
}

// drain forgets earlier reload signals.
func (h *fileHarness) drain() {
	for {
		select {
		case <-h.reloaded:
		default:
			return
		}
	}
}

// noChange fails if changed was called.
func (h *fileHarness) noChange() {
	h.t.Helper()
	select {
	case <-h.changed:
		h.t.Fatal("changed was called")
	default:
	}
}

func (h *fileHarness) services() []string {
	return names(h.f.Snapshot().Services)
}

func (h *fileHarness) wantServices(want ...string) {
	h.t.Helper()
	if got := h.services(); !equalStrings(got, want) {
		h.t.Fatalf("services = %q, want %q", got, want)
	}
}

func TestFileInitialLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "services.yaml")
	writeInPlace(t, path, stream(serviceDoc("b", 80), serviceDoc("a", 81), sliceDoc("a-1", "a")))

	h := newFileHarness(t, path)
	if st := h.f.Status(); st.Synced || !st.LastChange.IsZero() || st.Err != nil {
		t.Errorf("status before Run = %+v", st)
	}
	before := time.Now()
	h.start()
	h.waitChanged()
	h.wantServices("default/a", "default/b") // sorted
	snap := h.f.Snapshot()
	if len(snap.Slices) != 1 || snap.Node != nil {
		t.Errorf("snapshot = %+v", snap)
	}
	st := h.f.Status()
	if !st.Synced || st.Err != nil || !st.ErrSince.IsZero() || st.LastChange.Before(before) {
		t.Errorf("status = %+v", st)
	}
}

func TestFileEmptyFileLoads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	writeInPlace(t, path, "")
	h := newFileHarness(t, path)
	h.start()
	h.waitChanged() // the first complete load, even if empty
	if st := h.f.Status(); !st.Synced || st.Err != nil {
		t.Errorf("status = %+v", st)
	}
}

func TestFileMissingDirectory(t *testing.T) {
	f := NewFile(filepath.Join(t.TempDir(), "nope", "services.yaml"), testLogger(t))
	err := f.Run(context.Background(), nil)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Run = %v, want a not-exist error", err)
	}
}

func TestFileRunTwice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	writeInPlace(t, path, serviceDoc("a", 80))
	h := newFileHarness(t, path)
	h.start()
	h.waitChanged()
	if err := h.f.Run(context.Background(), nil); err == nil {
		t.Fatal("second concurrent Run succeeded")
	}
}

func TestFileMissingAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	h := newFileHarness(t, path)
	h.start()
	h.waitReload("Err set", func() bool { return h.f.Status().Err != nil })
	st := h.f.Status()
	if st.Synced || !errors.Is(st.Err, fs.ErrNotExist) || st.ErrSince.IsZero() {
		t.Errorf("status = %+v", st)
	}
	if !strings.Contains(st.Err.Error(), path) {
		t.Errorf("error %q does not name the file", st.Err)
	}
	h.noChange()

	writeAtomic(t, path, serviceDoc("a", 80))
	h.waitChanged()
	h.wantServices("default/a")
	if st := h.f.Status(); !st.Synced || st.Err != nil || !st.ErrSince.IsZero() {
		t.Errorf("status = %+v", st)
	}
}

// TestFileWatch goes through the ways a file changes, one after the other.
func TestFileWatch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "services.yaml")
	writeInPlace(t, path, serviceDoc("a", 80))
	// Unrelated files in the directory do not matter.
	writeInPlace(t, filepath.Join(dir, "other.yaml"), "not: [yaml")

	h := newFileHarness(t, path)
	h.start()
	h.waitChanged()
	h.wantServices("default/a")

	t.Log("write in place")
	writeInPlace(t, path, stream(serviceDoc("a", 80), serviceDoc("b", 80)))
	h.waitChanged()
	h.wantServices("default/a", "default/b")

	t.Log("replace through a rename")
	writeAtomic(t, path, serviceDoc("c", 80))
	h.waitChanged()
	h.wantServices("default/c")

	t.Log("reformat without changing the objects")
	h.drain()
	writeAtomic(t, path, "# the same, formatted differently\n---\nkind: Service\napiVersion: v1\nmetadata: {name: c, namespace: default}\nspec: {ports: [{port: 80}]}\n")
	h.waitReload("reload", func() bool { return true })
	h.noChange()
	h.wantServices("default/c")

	t.Log("broken version")
	good := h.f.Status().LastChange
	writeAtomic(t, path, serviceDoc("c", 80)+"  portz: 1\n")
	h.waitReload("Err set", func() bool { return h.f.Status().Err != nil })
	h.noChange()
	h.wantServices("default/c")
	st := h.f.Status()
	want := path + `:8: document 1 (Service default/c): unknown field "spec.portz"`
	if st.Err.Error() != want || st.ErrSince.IsZero() || !st.Synced || !st.LastChange.Equal(good) {
		t.Errorf("status = %+v, want error %q", st, want)
	}
	since := st.ErrSince

	t.Log("another broken version keeps ErrSince")
	writeInPlace(t, path, "kind: Service\n")
	h.waitReload("second error", func() bool {
		err := h.f.Status().Err
		return err != nil && strings.Contains(err.Error(), "apiVersion is required")
	})
	if st := h.f.Status(); !st.ErrSince.Equal(since) {
		t.Errorf("ErrSince moved from %v to %v", since, st.ErrSince)
	}

	t.Log("fixed")
	writeInPlace(t, path, serviceDoc("d", 80))
	h.waitChanged()
	h.wantServices("default/d")
	if st := h.f.Status(); st.Err != nil || !st.ErrSince.IsZero() {
		t.Errorf("status = %+v", st)
	}

	t.Log("removed")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	h.waitReload("Err set", func() bool { return errors.Is(h.f.Status().Err, fs.ErrNotExist) })
	h.noChange()
	h.wantServices("default/d")

	t.Log("created again with the same objects")
	writeInPlace(t, path, serviceDoc("d", 80))
	h.waitReload("Err cleared", func() bool { return h.f.Status().Err == nil })
	h.noChange()
	h.wantServices("default/d")

	t.Log("renamed away, another file renamed in")
	if err := os.Rename(path, path+".old"); err != nil {
		t.Fatal(err)
	}
	h.waitReload("Err set", func() bool { return h.f.Status().Err != nil })
	writeInPlace(t, filepath.Join(dir, "new.yaml"), serviceDoc("e", 80))
	if err := os.Rename(filepath.Join(dir, "new.yaml"), path); err != nil {
		t.Fatal(err)
	}
	h.waitChanged()
	h.wantServices("default/e")

	t.Log("made unreadable and readable again")
	if os.Getuid() != 0 { // root reads anything
		if err := os.Chmod(path, 0); err != nil {
			t.Fatal(err)
		}
		h.waitReload("Err set", func() bool { return errors.Is(h.f.Status().Err, fs.ErrPermission) })
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		h.waitReload("Err cleared", func() bool { return h.f.Status().Err == nil })
		h.noChange()
	}
}

// TestFileWriteInProgress checks that a file being written in place is not
// read before the writer closes it.
func TestFileWriteInProgress(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	writeInPlace(t, path, serviceDoc("a", 80))
	h := newFileHarness(t, path)
	h.start()
	h.waitChanged()

	full := stream(serviceDoc("a", 80), serviceDoc("b", 80))
	w, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteString(full[:len(full)/2]); err != nil {
		t.Fatal(err)
	}
	// An attribute change would trigger a reload; the open writer defers
	// it.
	h.drain()
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	// Proving that nothing happens takes a wait: several debounce
	// periods.
	time.Sleep(50 * time.Millisecond)
	select {
	case <-h.reloaded:
		t.Fatal("the file was read while being written")
	default:
	}
	if _, err := w.WriteString(full[len(full)/2:]); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	h.waitChanged()
	h.wantServices("default/a", "default/b")
	if st := h.f.Status(); st.Err != nil || !st.ErrSince.IsZero() {
		t.Errorf("a half-written file was read: %+v", st)
	}
}

// TestFileConfigMapVolume swaps the file the way the kubelet updates a
// ConfigMap volume: the file is a symlink through "..data", a symlink to a
// timestamped directory that is replaced by a rename.
func TestFileConfigMapVolume(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeInPlace(t, filepath.Join(dir, name, "services.yaml"), content)
	}
	version("..2026_01_01_00_00_00.1", serviceDoc("a", 80))
	if err := os.Symlink("..2026_01_01_00_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "services.yaml")
	if err := os.Symlink("..data/services.yaml", path); err != nil {
		t.Fatal(err)
	}
	h := newFileHarness(t, path)
	h.start()
	h.waitChanged()
	h.wantServices("default/a")

	for i, svc := range []string{"b", "c"} {
		next := fmt.Sprintf("..2026_01_01_00_00_0%d.1", i+1)
		version(next, serviceDoc(svc, 80))
		if err := os.Symlink(next, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		old, err := os.Readlink(filepath.Join(dir, "..data"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
		h.waitChanged()
		h.wantServices("default/" + svc)
	}
}

// TestFileSymlinkElsewhere edits, in place, the target of a symlink that
// lives in another directory.
func TestFileSymlinkElsewhere(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	target := filepath.Join(other, "real.yaml")
	writeInPlace(t, target, serviceDoc("a", 80))
	path := filepath.Join(dir, "services.yaml")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	h := newFileHarness(t, path)
	h.start()
	h.waitChanged()
	h.wantServices("default/a")

	writeInPlace(t, target, serviceDoc("b", 80))
	h.waitChanged()
	h.wantServices("default/b")

	t.Log("link pointed elsewhere")
	second := filepath.Join(other, "second.yaml")
	writeInPlace(t, second, serviceDoc("c", 80))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(second, path); err != nil {
		t.Fatal(err)
	}
	h.waitChanged()
	h.wantServices("default/c")

	writeInPlace(t, second, serviceDoc("d", 80))
	h.waitChanged()
	h.wantServices("default/d")
}

// TestFilePolling checks the periodic check alone, as when inotify is not
// available.
func TestFilePolling(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	writeInPlace(t, path, serviceDoc("a", 80))
	h := newFileHarness(t, path, WithPollInterval(5*time.Millisecond))
	h.f.noWatch = true
	h.start()
	h.waitChanged()
	h.wantServices("default/a")

	writeInPlace(t, path, serviceDoc("b", 80))
	h.waitChanged()
	h.wantServices("default/b")

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	h.waitReload("Err set", func() bool { return h.f.Status().Err != nil })
	h.wantServices("default/b")
	writeAtomic(t, path, serviceDoc("c", 80))
	h.waitChanged()
	h.wantServices("default/c")
}

func TestFileProxyName(t *testing.T) {
	data := stream(
		serviceDoc("plain", 80),
		serviceDoc("headless", 80, "service.kubernetes.io/headless", ""),
		serviceDoc("ours", 80, "service.kubernetes.io/service-proxy-name", "xdplb"),
		serviceDoc("theirs", 80, "service.kubernetes.io/service-proxy-name", "other"),
		sliceDoc("plain-1", "plain"),
		sliceDoc("headless-1", "headless", "service.kubernetes.io/headless", ""),
		sliceDoc("ours-1", "ours", "service.kubernetes.io/service-proxy-name", "xdplb"),
	)
	tests := []struct {
		proxy     string
		svcs, eps []string
	}{
		{"", []string{"default/plain"}, []string{"default/plain-1"}},
		{"xdplb", []string{"default/ours"}, []string{"default/ours-1"}},
	}
	for _, tt := range tests {
		t.Run("proxy="+tt.proxy, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "services.yaml")
			writeInPlace(t, path, data)
			h := newFileHarness(t, path, WithProxyName(tt.proxy))
			h.start()
			h.waitChanged()
			snap := h.f.Snapshot()
			if got := names(snap.Services); !equalStrings(got, tt.svcs) {
				t.Errorf("services = %q, want %q", got, tt.svcs)
			}
			if got := names(snap.Slices); !equalStrings(got, tt.eps) {
				t.Errorf("slices = %q, want %q", got, tt.eps)
			}
		})
	}
}

// TestFileStops checks that Run leaves no goroutine and no descriptor
// behind.
func TestFileStops(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	writeInPlace(t, path, serviceDoc("a", 80))
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		return len(ents)
	}
	goroutinesBefore, fdsBefore := runtime.NumGoroutine(), fds()

	for range 3 {
		f := NewFile(path, testLogger(t), WithDebounce(time.Millisecond))
		ctx, cancel := context.WithCancel(context.Background())
		changed := make(chan struct{}, 10)
		done := make(chan error, 1)
		go func() { done <- f.Run(ctx, func() { changed <- struct{}{} }) }()
		select {
		case <-changed:
		case <-time.After(waitTimeout):
			t.Fatal("not loaded")
		}
		writeInPlace(t, path, serviceDoc("a", 81)) // events in flight
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(waitTimeout):
			t.Fatal("Run did not return")
		}
	}

	// Goroutines that have returned may take a moment to be gone.
	deadline := time.Now().Add(waitTimeout)
	for runtime.NumGoroutine() > goroutinesBefore || fds() > fdsBefore {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines (was %d), %d descriptors (was %d)\n%s",
				runtime.NumGoroutine(), goroutinesBefore, fds(), fdsBefore, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An object edited by hand keeps the resourceVersion it was exported with;
// the services file must still be seen to change it.
func TestFileEditKeepingResourceVersion(t *testing.T) {
	doc := func(addr string) string {
		return `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default, resourceVersion: "42"}
spec: {type: ClusterIP, clusterIP: 10.96.0.10, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  resourceVersion: "42"
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [` + addr + `], conditions: {ready: true}}]
`
	}
	path := filepath.Join(t.TempDir(), "services.yaml")
	writeAtomic(t, path, doc("10.244.0.1"))
	h := newFileHarness(t, path)
	h.start()
	h.waitChanged()
	inc := model.NewIncremental()
	backends := func() []string {
		t.Helper()
		snap := h.f.Snapshot()
		st, _, _ := inc.Update(model.Input{Services: snap.Services, Slices: snap.Slices})
		var out []string
		for _, s := range st.Services {
			for _, e := range s.Endpoints {
				out = append(out, e.Addr.String())
			}
		}
		return out
	}
	if got := backends(); len(got) != 1 || got[0] != "10.244.0.1" {
		t.Fatalf("first load: backends %v, want 10.244.0.1", got)
	}
	writeAtomic(t, path, doc("10.244.0.2"))
	h.waitChanged()
	if got := backends(); len(got) != 1 || got[0] != "10.244.0.2" {
		t.Fatalf("after the edit: backends %v, want 10.244.0.2 (the edit was taken for no change)", got)
	}
}
