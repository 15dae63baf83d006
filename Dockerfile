# syntax=docker/dockerfile:1
#
# The xdplb agent image:
#
#   docker build --build-arg VERSION="$(git describe --tags --always --dirty)" -t ghcr.io/xdplb/xdplb:latest .
#
# The build stage compiles the binary exactly as `make build` does, from the
# committed BPF objects (xdp/*.o are embedded): no clang, no kernel headers.
# The runtime stage holds the static binary and nothing else; the agent runs
# no other program. It runs as root with the capabilities the DaemonSet
# grants (BPF, NET_ADMIN, PERFMON, SYS_ADMIN): a non-root user cannot load
# BPF programs or attach them to interfaces. tests/dockerfile keeps this file
# in step with the Makefile and deploy/.
#
# VERSION is what `xdplb version` and the agent's log report: the build
# context has no .git (see .dockerignore), so the binary cannot find it
# itself. Without the build argument the image reports "unknown".

FROM golang:1.26-bookworm AS build
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=unknown
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=${VERSION}" -o bin/xdplb ./cmd/xdplb

FROM gcr.io/distroless/static-debian12
COPY --from=build /src/bin/xdplb /usr/local/bin/xdplb
# `docker run IMAGE` runs `xdplb agent`; the DaemonSet passes args: [agent]
# the same way, and `kubectl exec ... -- xdplb status` reaches the other
# commands.
ENTRYPOINT ["/usr/local/bin/xdplb"]
CMD ["agent"]
