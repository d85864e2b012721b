# walrelay as one static binary on a minimal, non-root runtime image.
#   docker build --build-arg VERSION=$(git describe --tags --always) \
#     --build-arg COMMIT=$(git rev-parse --short HEAD) \
#     --build-arg BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) -t walrelay .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
ARG BUILD_DATE=unknown
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.buildDate=${BUILD_DATE}" \
      -o /walrelay ./cmd/walrelay

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /walrelay /walrelay
USER nonroot:nonroot
# The admin listener (/healthz, /readyz, /metrics, /status) on every
# interface of the container, without authentication: publish it on a
# private address only (docker run -p 127.0.0.1:8087:8087; on Kubernetes,
# deploy/kubernetes's NetworkPolicy admits only Prometheus).
ENV WALRELAY_ADMIN_LISTEN=0.0.0.0:8087
EXPOSE 8087
# Healthy while streaming (walrelay status --ready asks /readyz; the image
# has no shell or curl).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["/walrelay", "status", "--ready"]
ENTRYPOINT ["/walrelay"]
CMD ["run"]
