// Package manifests tests the deploy/ manifests: each parses strictly into
// its Kubernetes type, the DaemonSet and RBAC keep their security-relevant
// properties, and a real API server accepts all of them (server-side dry
// run).
package manifests
