// Package apiserver runs a real etcd and kube-apiserver on loopback for
// integration tests.
//
// The binaries are built from the Go module proxy on first use and cached
// outside the repository, keyed by version (package k8sbin); build.sh in
// this directory does the same from a shell so that make and CI can build
// them before any test runs.
//
// A test starts a private pair and gets credentials from it:
//
//	s := apiserver.Start(t, apiserver.WithUser("alice"))
//	admin := s.Client()          // system:masters
//	agent := s.AgentAccess(t)    // deploy/'s ServiceAccount and RBAC
//	run(agent.Kubeconfig)        // e.g. the agent process
//	s.StopAPIServer()            // etcd keeps the data
//	s.StartAPIServer(ctx)        // same URL and credentials
//
// When the binaries cannot be had, tests are skipped, unless XDPLB_CI=1 is
// set, in which case they fail.
package apiserver
