#!/usr/bin/env bash
# `make demo-crash`: a payment whose API process is killed between its phases, right after the
# processor charged the card; the inspector shows the key waiting at its recovery point; the
# client's retry, on a new process, finishes it, and the processor still holds one charge.
#
# It builds the binaries with the failpoints compiled in (`make run` builds them without), finds
# or starts Postgres as `make run` does, and runs its own API and stand-in processor on ports 8090
# and 12121 (PAYMENTS_DEMO_PORT, PAYMENTS_DEMO_SIM_PORT) over a database of its own on that
# server, so it can run beside `make run`. PAYMENTS_DEMO_BIN names a directory of binaries
# already built with failpoints (the examples test passes the ones `make test` built) and skips
# the build. Exits non-zero if anything differs from what docs/watching-it.md says.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/toolchain.sh # the pinned compiler, linked if it is the installed one

if [ -n "${PAYMENTS_DEMO_BIN:-}" ]; then
  BIN=$PAYMENTS_DEMO_BIN
else
  echo "building with failpoints…" >&2
  SQLX_OFFLINE=true cargo build --quiet -p payments-api -p processor-sim --bins --features payments-domain/failpoints
  BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug
fi

pg_env=$(scripts/postgres.sh up)
export DATABASE_URL; DATABASE_URL=$(sed -n 's/^DATABASE_URL=//p' <<<"$pg_env")
PG_STARTED=$(sed -n 's/^PG_STARTED=//p' <<<"$pg_env")
# A database of its own on that server (created by `migrate` below): `make run`'s worker, on the
# database `make run` uses, would otherwise take the demo's key over once the dead process's
# lease ran out, and finish it against `make run`'s stand-in processor instead of the demo's.
url=${DATABASE_URL%%\?*}
query=${DATABASE_URL:${#url}}
DATABASE_URL=${url%/*}/payments_crash_demo$query
# Made afresh each time: it holds nothing worth keeping, and one migrated by an earlier build
# would make `migrate` refuse to start.
PSQL=$(command -v psql || ls /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -n 1)
"$PSQL" "${url%/*}/postgres$query" -XAq -c 'DROP DATABASE IF EXISTS payments_crash_demo' >/dev/null
PORT=${PAYMENTS_DEMO_PORT:-8090}
SIM_PORT=${PAYMENTS_DEMO_SIM_PORT:-12121}
B=http://127.0.0.1:$PORT
SIM=http://127.0.0.1:$SIM_PORT
WORK=$(mktemp -d)
TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
# The database is made afresh: a fresh key seals its endpoints' secrets.
SEALING_KEY=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')

children=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${children[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
  if [ -n "$PG_STARTED" ]; then scripts/postgres.sh down "$PG_STARTED" || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "demo-crash: $*" >&2; exit 1; }
wait_for() { # url
  for _ in $(seq 1 200); do curl -sf -o /dev/null "$1" && return 0; sleep 0.05; done
  fail "nothing answers at $1"
}
charges() { curl -s "$SIM/_sim/stats" | sed -n 's/.*"charges_created":\([0-9]*\).*/\1/p'; }
# A short lease (the shortest start-up allows with one 2 s processor call), so that the retry
# can take the dead process's key over within seconds instead of the default minute.
api() { # log file, failpoints
  PAYMENTS__HTTP__PORT=$PORT PAYMENTS__HTTP__ADMIN_PORT=0 PAYMENTS__PROCESSOR__BASE_URL=$SIM \
  PAYMENTS__PROCESSOR__CONNECT_TIMEOUT_MS=1000 PAYMENTS__PROCESSOR__REQUEST_TIMEOUT_MS=2000 \
  PAYMENTS__PROCESSOR__MAX_RETRIES=0 PAYMENTS__IDEMPOTENCY__LEASE_MS=8000 \
  PAYMENTS__INSPECTOR__ENABLED=true PAYMENTS__INSPECTOR__TOKEN=$TOKEN \
  PAYMENTS__WEBHOOKS__SEALING_KEY=$SEALING_KEY PAYMENTS__LOG__FILTER=warn PAYMENTS_FAILPOINTS=$2 \
    "$BIN/payments-api" serve 2>"$1" &
  children+=($!)
  wait_for "$B/readyz"
}

"$BIN/payments-api" migrate >/dev/null 2>&1
KEY=$("$BIN/payments-api" accounts create --name crash-demo 2>/dev/null)
"$BIN/processor-sim" --port "$SIM_PORT" 2>/dev/null &
children+=($!)
wait_for "$SIM/_sim/stats"

IDEM=crash-demo-$(date +%s%N)
pay() {
  curl -si "$B/v1/payments" -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
    -H "Idempotency-Key: $IDEM" --max-time 30 \
    -d '{"amount":1200,"currency":"usd","payment_method":"pm_card_visa"}' | tr -d '\r'
}

echo "1. An API that stops right after the processor answers (PAYMENTS_FAILPOINTS=payments.create.after_call=pause)"
api "$WORK/doomed.log" "payments.create.after_call=pause"
doomed=${children[-1]}
pay >"$WORK/first" 2>&1 &
client=$!
for _ in $(seq 1 400); do grep -q "FAILPOINT payments.create.after_call" "$WORK/doomed.log" && break; sleep 0.05; done
grep -q "FAILPOINT payments.create.after_call" "$WORK/doomed.log" || \
  fail "the API never reached its failpoint (are the binaries in $BIN built with failpoints? make demo-crash builds them)"
echo "   a payment is sent; the processor charged the card: $(charges) charge"

echo "2. The API is killed there (SIGKILL): the client gets no answer"
kill -9 "$doomed"
wait "$doomed" 2>/dev/null || true
wait "$client" 2>/dev/null || true
[ -s "$WORK/first" ] && fail "the client got an answer from a killed process: $(cat "$WORK/first")"
echo "   the client's answer: none"

echo "3. The inspector shows the key where the dead process left it"
api "$WORK/after.log" ""
key_id=$(psql "$DATABASE_URL" -Atc "SELECT id FROM idempotency_keys WHERE idempotency_key = '$IDEM'")
page=$(curl -s "$B/inspector/keys/$key_id" -H "Authorization: Bearer $TOKEN")
point=$(sed -n 's/.*<code id="recovery-point">\([a-z_]*\)<.*/\1/p' <<<"$page")
[ "$point" = payment_created ] || fail "the inspector shows the recovery point '$point'"
echo "   recovery point: $point (the payment is processing; the charge is not recorded yet)"
echo "   open $B/inspector/keys/$key_id (operator token: $TOKEN)"

echo "4. The client retries with the same Idempotency-Key (409 while the dead process's lease runs)"
waited=0
for _ in $(seq 1 30); do
  pay >"$WORK/retry"
  head -1 "$WORK/retry" | grep -q " 409 " || break
  waited=$((waited + 1))
  sleep 1
done
echo "   answered 409 idempotency_key_in_use $waited time(s), then:"
head -1 "$WORK/retry"
grep -i '^idempotent-replayed' "$WORK/retry" || true
tail -1 "$WORK/retry"; echo
head -1 "$WORK/retry" | grep -q " 201 " || fail "the retry did not finish the payment"
page=$(curl -s "$B/inspector/keys/$key_id" -H "Authorization: Bearer $TOKEN")
point=$(sed -n 's/.*<code id="recovery-point">\([a-z_]*\)<.*/\1/p' <<<"$page")
echo "   recovery point: $point"

echo "5. The processor still holds $(charges) charge: the retry sent the same downstream key and got the charge back"
[ "$(charges)" = 1 ] || fail "the processor holds $(charges) charges"

# In a terminal, keep the API up until Enter, so that the inspector's link shows the whole story.
if [ -t 0 ] && [ -t 1 ]; then
  echo
  echo "The inspector's page above now shows the key's whole timeline. Press Enter to stop."
  read -r _
fi
