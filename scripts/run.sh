#!/usr/bin/env bash
# `make run`: Postgres (found or started), migrations, a demo account, then the services, with the
# API in the foreground until Ctrl-C. Everything this script started is stopped when it ends.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

pg_env=$(scripts/postgres.sh up)
export DATABASE_URL; DATABASE_URL=$(sed -n 's/^DATABASE_URL=//p' <<<"$pg_env")
PG_STARTED=$(sed -n 's/^PG_STARTED=//p' <<<"$pg_env")

children=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${children[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$PG_STARTED" ]; then scripts/postgres.sh down "$PG_STARTED" || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "building…" >&2
SQLX_OFFLINE=true cargo build --quiet --bins
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug

"$BIN/payments-api" migrate
KEY=$("$BIN/payments-api" accounts create --name demo)
PORT=${PAYMENTS__HTTP__PORT:-8080}
BASE=http://127.0.0.1:$PORT

cat >&2 <<MSG

  payments-api is starting on $BASE (database: ${DATABASE_URL%%\?*})

  Demo secret key (shown once):  $KEY

  Try it:
    curl -s $BASE/v1/payments -H "Authorization: Bearer $KEY"

  Ctrl-C stops everything that \`make run\` started.

MSG

"$BIN/payments-api" serve &
children+=($!)
wait "${children[0]}"
