package apiserver

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/xdplb/xdplb/tests/apiserver/k8sbin"
)

// Run starts etcd and kube-apiserver outside of a test, for tools such as
// the perf suite: the same servers, flags and credentials as [Start], with
// data, logs and kubeconfigs under dir (created if missing, left in place
// afterwards). The binaries are built if they are not cached yet (see
// [k8sbin.Ensure]). The caller must call [Server.Stop]. Options that need a
// test ([Server.User], [Server.ServiceAccount], ...) are not meant for
// servers started this way; [Server.AdminConfig], [Server.Client] and
// [Server.AdminKubeconfig] are.
func Run(ctx context.Context, dir string, opts ...Option) (*Server, error) {
	o := options{readyTimeout: DefaultReadyTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if dir == "" {
		return nil, errors.New("apiserver.Run: a directory is required")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating server directory: %w", err)
	}
	bins, err := k8sbin.Ensure(ctx)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver/etcd binaries: %w", err)
	}
	s := &Server{
		bins:         bins,
		dir:          dir,
		readyTimeout: o.readyTimeout,
		cpus:         o.cpus,
		extraArgs:    o.extraArgs,
		userTokens:   make(map[string]string),
	}
	if err := s.start(ctx, o.users); err != nil {
		return nil, errors.Join(err, s.stopAll())
	}
	return s, nil
}

// Stop ends kube-apiserver and etcd of a server started with [Run]. (One
// from [Start] stops by itself when its test ends.)
func (s *Server) Stop() error { return s.stopAll() }
