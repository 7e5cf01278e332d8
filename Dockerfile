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

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 payments
COPY --from=build /out/ /usr/local/bin/
USER payments
EXPOSE 8080
CMD ["payments-api", "serve"]
