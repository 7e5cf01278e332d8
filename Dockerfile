# Multi-stage build: compile in the Rust image (offline query data in .sqlx/, so no database is
# needed), run on a slim Debian with only the binaries.
FROM rust:1.95-bookworm AS build
WORKDIR /src
ENV SQLX_OFFLINE=true
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p payments-api -p payments-worker -p processor-sim --bins \
 && mkdir -p /out \
 && find target/release -maxdepth 1 -type f -executable -exec cp {} /out/ \;

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 payments
COPY --from=build /out/ /usr/local/bin/
USER payments

# The stand-in card processor on its own, for other projects' test suites:
# `docker build --target processor-sim -t processor-sim .` then
# `docker run -p 12111:12111 processor-sim [--seed 7 …]` (arguments go to processor-sim; set the
# port with SIM_PORT, not --port, since the health check reads it).
FROM runtime AS processor-sim
ENV SIM_HOST=0.0.0.0 \
    SIM_PORT=12111
EXPOSE 12111
HEALTHCHECK --interval=2s --timeout=3s --start-period=5s --retries=15 \
  CMD curl -fsS "http://127.0.0.1:${SIM_PORT}/healthz" || exit 1
ENTRYPOINT ["processor-sim"]

# The default target (last): the API; docker-compose runs the worker and the migrations from it too.
FROM runtime AS app
EXPOSE 8080
CMD ["payments-api", "serve"]
