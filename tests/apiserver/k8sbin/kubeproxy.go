package k8sbin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// kube-proxy is not needed by the integration tests; the perf suite runs it
// as the reference datapath. It is built from the same k8s.io/kubernetes
// release as kube-apiserver and cached next to it, in [Dir].

// KubeProxyPath returns where kube-proxy for [KubernetesVersion] is (or will
// be) cached.
func KubeProxyPath() (string, error) {
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "kube-proxy"), nil
}

// CachedKubeProxy returns kube-proxy if it is already built.
func CachedKubeProxy() (string, bool) {
	path, err := KubeProxyPath()
	if err != nil {
		return "", false
	}
	return path, isExecutable(path)
}

// EnsureKubeProxy returns kube-proxy, building it from the Go module proxy
// when it is not cached yet. Like [Ensure] it is idempotent and safe to call
// from concurrent processes (the same lock file serialises the builds). A
// cold build takes several minutes; with the Go build cache warm from a
// kube-apiserver build, well under one.
func EnsureKubeProxy(ctx context.Context) (string, error) {
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "kube-proxy")
	if isExecutable(out) {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating binary directory: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, ".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if isExecutable(out) {
		return out, nil
	}
	logPath := filepath.Join(dir, "build.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", fmt.Errorf("opening build log: %w", err)
	}
	defer logFile.Close()
	bld := builder{dir: dir, log: logFile, logPath: logPath}
	if err := bld.buildKubernetesCommand(ctx, "kube-proxy", out); err != nil {
		return "", err
	}
	return out, nil
}
