// Command build-k8s-bins builds the etcd and kube-apiserver binaries the
// integration tests use (see package k8sbin) and prints their paths. It does
// nothing when they are already cached.
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
	slog.Info("test binaries ready", "took", time.Since(start).Round(time.Millisecond))
}
