# Rollout: a static rollout binary (and the example RL loop) on a small non-root image.
# Build: docker build -t rollout .   Run: docker run -p 8000:8000 rollout serve --addr 0.0.0.0:8000 ...
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The SIMD kernels use the simd/archsimd experiment; CGO is off so the binaries are static.
ENV CGO_ENABLED=0 GOEXPERIMENT=simd
ARG VERSION=devel
RUN go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/rollout ./cmd/rollout && \
    go build -trimpath -ldflags "-s -w" -o /out/rl-loop ./examples/rl-loop

FROM alpine:3.20
# busybox wget serves the health check; the process runs as an unprivileged user.
RUN adduser -D -u 10001 rollout && mkdir -p /data && chown rollout /data
COPY --from=build /out/rollout /out/rl-loop /usr/local/bin/
USER rollout
WORKDIR /data
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --retries=12 CMD wget -qO- http://127.0.0.1:8000/health >/dev/null || exit 1
ENTRYPOINT ["rollout"]
CMD ["serve", "--addr", "0.0.0.0:8000"]
