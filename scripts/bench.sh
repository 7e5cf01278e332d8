#!/usr/bin/env bash
# `make bench`: builds the release binaries, starts a private PostgreSQL server with
# pg_stat_statements loaded (its own directory and port, so it never touches another server),
# runs payments-bench against it, prints the table and stops the server.
#
# Arguments go to payments-bench (`make bench ARGS="--seconds 30"`; `--help` lists them). With
# BENCH_DATABASE_URL set, that server is used instead (it must preload pg_stat_statements).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/toolchain.sh # the pinned compiler, linked if it is the installed one

SQLX_OFFLINE=true cargo build --release --quiet \
  -p payments-api -p payments-worker -p processor-sim -p payments-bench

if [ -z "${BENCH_DATABASE_URL:-}" ]; then
  export PAYMENTS_PG_DIR=$ROOT/target/bench-pgdata
  export PAYMENTS_PG_PORT=${BENCH_PG_PORT:-54339}
  export PAYMENTS_PG_OPTIONS="-c shared_preload_libraries=pg_stat_statements -c max_connections=200"
  scripts/postgres.sh cluster >/dev/null
  trap 'scripts/postgres.sh down cluster' EXIT
  BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:$PAYMENTS_PG_PORT/payments_bench
fi
export BENCH_DATABASE_URL
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
"$BIN/payments-bench" --bin-dir "$BIN" "$@"
