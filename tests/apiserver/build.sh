#!/bin/sh
# Builds (once, then cached outside the repository) the etcd and
# kube-apiserver binaries that the integration tests run, and prints their
# paths. Safe to run concurrently and repeatedly.
#
#   XDPLB_K8S_BIN_DIR      where the binaries go (default: a versioned
#                          directory under ${XDG_CACHE_HOME:-~/.cache}/xdplb)
#   XDPLB_K8S_GOTOOLCHAIN  GOTOOLCHAIN for this build only (e.g. go1.27.3)
set -eu
cd "$(dirname "$0")/../.."
exec go run ./tests/apiserver/cmd/build-k8s-bins "$@"
