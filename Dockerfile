# Rollout: a static rollout binary (and the example RL loop) on a small non-root image.
#
#   docker build -t rollout .
#   docker run --rm -p 127.0.0.1:8000:8000 rollout
#
# The default command serves builtin:tiny on port 8000 with the admin routes on a loopback
# listener inside the container (reach them with `docker exec`); to expose them, pass
# --admin-token-file. docker-compose.yml shows a fleet with generated secrets.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# CGO is off so the binaries are static. No Go experiment by default: the default build's
# engine kernels are Go assembly (AVX-512/AVX2 on amd64, NEON on arm64), faster than the
# simd/archsimd ones GOEXPERIMENT=simd selects (docs/perf.md); --build-arg GOEXPERIMENT=simd
# builds those instead, as `make GOEXPERIMENT=simd build` does.
ARG GOEXPERIMENT=
ENV CGO_ENABLED=0 GOEXPERIMENT=${GOEXPERIMENT}
ARG VERSION=devel
RUN go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/rollout ./cmd/rollout && \
    go build -trimpath -ldflags "-s -w" -o /out/rl-loop ./examples/rl-loop

FROM alpine:3.20
# busybox wget serves the health check; the process runs as an unprivileged user. /data/run
# exists (owned by it) so that a volume mounted there, like compose's rl-run, starts out
# writable by it.
RUN adduser -D -u 10001 rollout && mkdir -p /data/run && chown -R rollout /data
COPY --from=build /out/rollout /out/rl-loop /usr/local/bin/
USER rollout
WORKDIR /data
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --retries=12 CMD wget -qO- http://127.0.0.1:8000/health >/dev/null || exit 1
ENTRYPOINT ["rollout"]
# Without an admin token `serve` refuses admin routes on a non-loopback listener (anyone who
# reached the port would be an admin): --admin-addr keeps them on the container's loopback.
CMD ["serve", "--addr", "0.0.0.0:8000", "--admin-addr", "127.0.0.1:8001"]
