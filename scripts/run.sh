#!/usr/bin/env bash
# `make run`: Postgres (found or started), migrations, a demo account, then the services, with the
# API in the foreground until Ctrl-C. Everything this script started is stopped when it ends.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/toolchain.sh # the pinned compiler, linked if it is the installed one

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
# Only the binaries: the end-to-end tests compile failpoints in, and `make run` does not want them.
SQLX_OFFLINE=true cargo build --quiet -p payments-api -p payments-worker -p processor-sim --bins
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug

wait_for_port() {
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing answers on port $1" >&2
  return 1
}

"$BIN/payments-api" migrate
KEY=$("$BIN/payments-api" accounts create --name demo)
PORT=${PAYMENTS__HTTP__PORT:-8080}
SIM_PORT=${SIM_PORT:-12111}
BASE=http://127.0.0.1:$PORT
export PAYMENTS__PROCESSOR__BASE_URL=${PAYMENTS__PROCESSOR__BASE_URL:-http://127.0.0.1:$SIM_PORT}
# The inspector, with a fresh operator token unless one is given.
# Local runs deliver webhooks to a receiver on this machine (docs/reference/local-webhooks.md).
export PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK=${PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK:-true}
export PAYMENTS__INSPECTOR__ENABLED=${PAYMENTS__INSPECTOR__ENABLED:-true}
export PAYMENTS__INSPECTOR__TOKEN=${PAYMENTS__INSPECTOR__TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
# The key that seals webhook endpoints' signing secrets, unless one is given: made once and kept
# beside the build, since the endpoints of the last run, still in the database, need it to open.
SEALING_KEY_FILE=${CARGO_TARGET_DIR:-$ROOT/target}/run-sealing-key
if [ -z "${PAYMENTS__WEBHOOKS__SEALING_KEY:-}" ] && [ ! -s "$SEALING_KEY_FILE" ]; then
  (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$SEALING_KEY_FILE")
fi
export PAYMENTS__WEBHOOKS__SEALING_KEY=${PAYMENTS__WEBHOOKS__SEALING_KEY:-$(cat "$SEALING_KEY_FILE")}

# The stand-in's webhooks (charge.*) go to the API, signed with a fresh secret both sides share.
export PAYMENTS__PROCESSOR__WEBHOOK_SECRET=${PAYMENTS__PROCESSOR__WEBHOOK_SECRET:-whsec_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}

SIM_WEBHOOK_SECRET=$PAYMENTS__PROCESSOR__WEBHOOK_SECRET \
  "$BIN/processor-sim" --port "$SIM_PORT" --webhook-url "$BASE/webhooks/processor" &
children+=($!)
wait_for_port "$SIM_PORT"
if [ -x "$BIN/payments-worker" ]; then
  "$BIN/payments-worker" &
  children+=($!)
fi

cat >&2 <<MSG

  payments-api is starting on $BASE (database: ${DATABASE_URL%%\?*})
  stand-in processor on http://127.0.0.1:$SIM_PORT

  Demo secret key (shown once):  $KEY

  Try it (docs/reference/http-api.md walks through capture, refunds and declines):
    curl -s $BASE/v1/payments -H "Authorization: Bearer $KEY" \\
      -H "Idempotency-Key: banner-1" -H "Content-Type: application/json" \\
      -d '{"amount":500,"currency":"usd","payment_method":"pm_card_visa"}'
    curl -s $BASE/v1/payments -H "Authorization: Bearer $KEY"

  Watch the keys and their phases in the inspector (read-only; it asks for this token once):
    $BASE/inspector
    operator token: $PAYMENTS__INSPECTOR__TOKEN

  Metrics and the readiness checks, on the admin listener (this machine only):
    http://${PAYMENTS__HTTP__ADMIN_HOST:-127.0.0.1}:${PAYMENTS__HTTP__ADMIN_PORT:-8081}/metrics

  Ctrl-C stops everything that \`make run\` started.

MSG

"$BIN/payments-api" serve &
children+=($!)
wait "${children[-1]}"
