// Package k8sbin builds etcd and kube-apiserver from the Go module proxy
// for tests and caches them outside the repository, keyed by version.
package k8sbin

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

const (
	// KubernetesVersion is the k8s.io/kubernetes release kube-apiserver is
	// built from.
	KubernetesVersion = "v1.37.2"
	// EtcdVersion is the go.etcd.io/etcd/server/v3 release etcd is built from.
	EtcdVersion = "v3.7.3"

	// EnvBinDir overrides the directory holding (or receiving) the binaries.
	EnvBinDir = "XDPLB_K8S_BIN_DIR"
	// EnvGoToolchain, when set, is passed as GOTOOLCHAIN to the go commands
	// of the binary build only (for example go1.27.3 should a future
	// release need a newer Go than the one installed).
	EnvGoToolchain = "XDPLB_K8S_GOTOOLCHAIN"
)

// Binaries locates a built etcd and kube-apiserver.
type Binaries struct {
	// Dir holds both binaries, the build log and the build modules.
	Dir           string
	KubeAPIServer string
	Etcd          string
}

func binariesIn(dir string) Binaries {
	return Binaries{
		Dir:           dir,
		KubeAPIServer: filepath.Join(dir, "kube-apiserver"),
		Etcd:          filepath.Join(dir, "etcd"),
	}
}

// complete reports whether both binaries exist. They are renamed into place
// only once fully written, so existence means a finished build.
func (b Binaries) complete() bool {
	return isExecutable(b.KubeAPIServer) && isExecutable(b.Etcd)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// Dir returns where the binaries for [KubernetesVersion] and
// [EtcdVersion] live: $XDPLB_K8S_BIN_DIR if set, otherwise
// $XDG_CACHE_HOME/xdplb/k8s-<version>-etcd-<version> (XDG_CACHE_HOME
// defaulting to ~/.cache).
func Dir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		return filepath.Abs(dir)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("locating the user cache directory (or set %s): %w", EnvBinDir, err)
	}
	return filepath.Join(cache, "xdplb", "k8s-"+KubernetesVersion+"-etcd-"+EtcdVersion), nil
}

// Cached returns the binaries if both are already built.
func Cached() (Binaries, bool) {
	dir, err := Dir()
	if err != nil {
		return Binaries{}, false
	}
	b := binariesIn(dir)
	return b, b.complete()
}

// Ensure returns etcd and kube-apiserver, building whichever is
// missing. It is idempotent and safe to call from concurrent processes: an
// exclusive lock on a file in [Dir] serialises builds, and a caller that
// waited for another's build finds the binaries in place. A cold build takes
// several minutes (kube-apiserver dominates), so run
// tests/apiserver/build.sh before the tests.
func Ensure(ctx context.Context) (Binaries, error) {
	dir, err := Dir()
	if err != nil {
		return Binaries{}, err
	}
	b := binariesIn(dir)
	if b.complete() {
		return b, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Binaries{}, fmt.Errorf("creating binary directory: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, ".lock"))
	if err != nil {
		return Binaries{}, err
	}
	defer unlock()
	if b.complete() {
		return b, nil
	}

	logPath := filepath.Join(dir, "build.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Binaries{}, fmt.Errorf("opening build log: %w", err)
	}
	defer logFile.Close()

	bld := builder{dir: dir, log: logFile, logPath: logPath}
	if !isExecutable(b.Etcd) {
		if err := bld.buildEtcd(ctx, b.Etcd); err != nil {
			return Binaries{}, err
		}
	}
	if !isExecutable(b.KubeAPIServer) {
		if err := bld.buildKubeAPIServer(ctx, b.KubeAPIServer); err != nil {
			return Binaries{}, err
		}
	}
	return b, nil
}

// lockFile takes an exclusive flock on path, polling so that ctx can cancel
// the wait. Locks are per open file description, so goroutines of one
// process exclude each other as well.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening build lock: %w", err)
	}
	logged := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if !logged {
			slog.Info("waiting for another build of the test binaries", "lock", path)
			logged = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for build lock %s: %w", path, context.Cause(ctx))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

type builder struct {
	dir     string
	log     io.Writer
	logPath string
}

// buildEtcd builds etcd from a throwaway module requiring etcd's server
// module, whose root package is the etcd main.
func (b builder) buildEtcd(ctx context.Context, out string) error {
	start := time.Now()
	slog.Info("building etcd for tests", "version", EtcdVersion, "dir", b.dir)
	src := filepath.Join(b.dir, "src", "etcd")
	const pkg = "go.etcd.io/etcd/server/v3"
	if err := writeGoMod(src, "xdplb.invalid/testbin/etcd", nil, nil); err != nil {
		return err
	}
	if err := b.goCmd(ctx, src, "get", pkg+"@"+EtcdVersion); err != nil {
		return fmt.Errorf("resolving etcd %s: %w", EtcdVersion, err)
	}
	if err := b.goBuild(ctx, src, pkg, out, "-s -w"); err != nil {
		return fmt.Errorf("building etcd %s: %w", EtcdVersion, err)
	}
	slog.Info("built etcd", "path", out, "took", time.Since(start).Round(time.Second))
	return nil
}

// buildKubeAPIServer builds kube-apiserver (see [builder.buildKubernetesCommand]).
func (b builder) buildKubeAPIServer(ctx context.Context, out string) error {
	return b.buildKubernetesCommand(ctx, "kube-apiserver", out)
}

// buildKubernetesCommand builds k8s.io/kubernetes/cmd/<name> at
// [KubernetesVersion] from a throwaway module requiring k8s.io/kubernetes.
// That module's go.mod points its staging modules at ./staging, which module
// zips leave out, so the build module replaces each of them with its
// published release instead.
func (b builder) buildKubernetesCommand(ctx context.Context, name, out string) error {
	start := time.Now()
	slog.Info("building "+name+" (a cold build takes several minutes)",
		"version", KubernetesVersion, "dir", b.dir)
	src := filepath.Join(b.dir, "src", name)
	const mod = "k8s.io/kubernetes"
	pkg := mod + "/cmd/" + name
	module := "xdplb.invalid/testbin/" + name
	if err := writeGoMod(src, module, nil, nil); err != nil {
		return err
	}
	kubeGoMod, err := b.downloadGoMod(ctx, src, mod+"@"+KubernetesVersion)
	if err != nil {
		return err
	}
	staging, err := stagingModules(kubeGoMod)
	if err != nil {
		return err
	}
	stagingVersion, err := stagingVersionFor(KubernetesVersion)
	if err != nil {
		return err
	}
	replaces := make(map[string]string, len(staging))
	for _, m := range staging {
		replaces[m] = stagingVersion
	}
	if err := writeGoMod(src, module, map[string]string{mod: KubernetesVersion}, replaces); err != nil {
		return err
	}
	if err := b.goCmd(ctx, src, "get", pkg+"@"+KubernetesVersion); err != nil {
		return fmt.Errorf("resolving %s %s: %w", name, KubernetesVersion, err)
	}
	major, minor, _ := strings.Cut(strings.TrimPrefix(KubernetesVersion, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	const v = "k8s.io/component-base/version."
	ldflags := strings.Join([]string{
		"-s", "-w",
		"-X", v + "gitVersion=" + KubernetesVersion,
		"-X", v + "gitMajor=" + major,
		"-X", v + "gitMinor=" + minor,
		"-X", v + "gitTreeState=clean",
	}, " ")
	if err := b.goBuild(ctx, src, pkg, out, ldflags); err != nil {
		return fmt.Errorf("building %s %s: %w", name, KubernetesVersion, err)
	}
	slog.Info("built "+name, "path", out, "took", time.Since(start).Round(time.Second))
	return nil
}

// stagingVersionFor maps a Kubernetes release to the version its staging
// modules are published at: v1.37.2 -> v0.37.2.
func stagingVersionFor(kube string) (string, error) {
	rest, ok := strings.CutPrefix(kube, "v1.")
	if !ok {
		return "", fmt.Errorf("unexpected Kubernetes version %q", kube)
	}
	return "v0." + rest, nil
}

// stagingModules lists the modules that a k8s.io/kubernetes go.mod replaces
// with directories under ./staging/.
func stagingModules(goMod []byte) ([]string, error) {
	var mods []string
	inReplace := false
	sc := bufio.NewScanner(bytes.NewReader(goMod))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "//"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		switch {
		case line == "replace (":
			inReplace = true
			continue
		case inReplace && line == ")":
			inReplace = false
			continue
		case strings.HasPrefix(line, "replace "):
			line = strings.TrimPrefix(line, "replace ")
		case !inReplace:
			continue
		}
		from, to, ok := strings.Cut(line, "=>")
		if !ok {
			continue
		}
		fromFields, toFields := strings.Fields(from), strings.Fields(to)
		if len(fromFields) == 0 || len(toFields) != 1 {
			continue
		}
		if strings.HasPrefix(toFields[0], "./staging/") {
			mods = append(mods, fromFields[0])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading k8s.io/kubernetes go.mod: %w", err)
	}
	if len(mods) == 0 {
		return nil, errors.New("k8s.io/kubernetes go.mod replaces no staging modules: layout changed")
	}
	return mods, nil
}

// writeGoMod writes dir/go.mod with the given requirements and version
// replacements (module => same module at another version).
func writeGoMod(dir, module string, require, replace map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating build module directory: %w", err)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "// Generated to build a test binary; safe to delete.\n\nmodule %s\n\ngo 1.26.0\n", module)
	if len(require) > 0 {
		sb.WriteString("\nrequire (\n")
		for _, m := range slices.Sorted(maps.Keys(require)) {
			fmt.Fprintf(&sb, "\t%s %s\n", m, require[m])
		}
		sb.WriteString(")\n")
	}
	if len(replace) > 0 {
		sb.WriteString("\nreplace (\n")
		for _, m := range slices.Sorted(maps.Keys(replace)) {
			fmt.Fprintf(&sb, "\t%s => %s %s\n", m, m, replace[m])
		}
		sb.WriteString(")\n")
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(sb.String()), 0o644); err != nil {
		return fmt.Errorf("writing build go.mod: %w", err)
	}
	return nil
}

// downloadGoMod fetches module@version through the module proxy and returns
// its go.mod.
func (b builder) downloadGoMod(ctx context.Context, dir, modVersion string) ([]byte, error) {
	var stdout bytes.Buffer
	cmd, err := b.command(ctx, dir, "mod", "download", "-json", modVersion)
	if err != nil {
		return nil, err
	}
	cmd.Stdout = &stdout
	runErr := cmd.Run()
	var info struct {
		GoMod string
		Error string
	}
	if err := json.Unmarshal(stdout.Bytes(), &info); err != nil && runErr == nil {
		return nil, fmt.Errorf("decoding go mod download output for %s: %w", modVersion, err)
	}
	if info.Error != "" {
		return nil, fmt.Errorf("downloading %s: %s", modVersion, info.Error)
	}
	if runErr != nil {
		return nil, fmt.Errorf("downloading %s: %w (log: %s)", modVersion, runErr, b.logPath)
	}
	data, err := os.ReadFile(info.GoMod)
	if err != nil {
		return nil, fmt.Errorf("reading go.mod of %s: %w", modVersion, err)
	}
	return data, nil
}

func (b builder) goBuild(ctx context.Context, dir, pkg, out, ldflags string) error {
	tmp := out + ".tmp"
	_ = os.Remove(tmp)
	if err := b.goCmd(ctx, dir, "build", "-trimpath", "-ldflags", ldflags, "-o", tmp, pkg); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("moving %s into place: %w", filepath.Base(out), err)
	}
	return nil
}

// goCmd runs the go command in dir, sending its output to the build log; the
// error carries the tail of that output.
func (b builder) goCmd(ctx context.Context, dir string, args ...string) error {
	cmd, err := b.command(ctx, dir, args...)
	if err != nil {
		return err
	}
	var tail tailBuffer
	cmd.Stdout = io.MultiWriter(b.log, &tail)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, tail.String())
	}
	return nil
}

func (b builder) command(ctx context.Context, dir string, args ...string) (*exec.Cmd, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("finding the go command: %w", err)
	}
	fmt.Fprintf(b.log, "\n# %s: (cd %s && go %s)\n", time.Now().Format(time.RFC3339), dir, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = dir
	cmd.Stderr = b.log
	cmd.WaitDelay = 10 * time.Second
	// Later entries win: the build module stands alone, whatever the
	// caller's workspace, flags or cgo setting.
	cmd.Env = append(os.Environ(),
		"GOWORK=off",
		"GO111MODULE=on",
		"GOFLAGS=-mod=mod -buildvcs=false",
		"CGO_ENABLED=0",
	)
	if tc := os.Getenv(EnvGoToolchain); tc != "" {
		cmd.Env = append(cmd.Env, "GOTOOLCHAIN="+tc)
	}
	return cmd, nil
}

// tailBuffer keeps the last few KiB written to it.
type tailBuffer struct {
	buf []byte
}

const tailSize = 4 << 10

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailSize {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailSize:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.buf) }
