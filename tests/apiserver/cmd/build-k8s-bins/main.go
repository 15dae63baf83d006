// Command build-k8s-bins builds the etcd and kube-apiserver binaries the
// integration tests use (see package k8sbin) and prints their paths. It does
// nothing when they are already cached. With -kube-proxy it also builds
// kube-proxy, which the perf suite runs as its reference datapath.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/xdplb/xdplb/tests/apiserver/k8sbin"
)

func main() {
	timeout := flag.Duration("timeout", 60*time.Minute, "give up after this long")
	kubeProxy := flag.Bool("kube-proxy", false, "also build kube-proxy (used by the perf suite)")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	start := time.Now()
	b, err := k8sbin.Ensure(ctx)
	if err != nil {
		slog.Error("building test binaries failed", "err", err)
		os.Exit(1)
	}
	fmt.Printf("kube-apiserver %s: %s\netcd %s: %s\n",
		k8sbin.KubernetesVersion, b.KubeAPIServer, k8sbin.EtcdVersion, b.Etcd)
	if *kubeProxy {
		path, err := k8sbin.EnsureKubeProxy(ctx)
		if err != nil {
			slog.Error("building kube-proxy failed", "err", err)
			os.Exit(1)
		}
		fmt.Printf("kube-proxy %s: %s\n", k8sbin.KubernetesVersion, path)
	}
	slog.Info("test binaries ready", "took", time.Since(start).Round(time.Millisecond))
}
