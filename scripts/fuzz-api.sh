#!/usr/bin/env bash
# `make fuzz-api`: schemathesis against the live server's /openapi.json, with authentication.
# Every response must be documented (status, media type, headers, schema) and none may be a 5xx.
#
# It starts processor-sim and payments-api on free ports against a database of its own
# (payments_fuzz on the server scripts/postgres.sh finds), and installs schemathesis into
# target/fuzz-venv the first time. FUZZ_EXAMPLES (default 100, as `make fuzz-api`) sets the test cases per operation;
# FUZZ_DATABASE names its database (default payments_fuzz). FUZZ_SEED fixes the run (make test
# uses a fixed seed; by hand it is random). The hooks in scripts/fuzz_hooks.py put control
# characters (NUL, ESC, DEL, …) into the generated strings.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/toolchain.sh # the pinned compiler, linked if it is the installed one
EXAMPLES=${FUZZ_EXAMPLES:-100}
VENV=$ROOT/target/fuzz-venv
say() { echo "fuzz-api: $*" >&2; }

if ! "$VENV/bin/schemathesis" --version >/dev/null 2>&1; then
  say "installing schemathesis into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r scripts/fuzz-requirements.txt
fi

SQLX_OFFLINE=true cargo build --quiet --workspace --bins
BIN=$ROOT/target/debug

eval "$(scripts/postgres.sh up | sed 's/^/export /')"
STARTED=${PG_STARTED:-}
export DATABASE_URL=${DATABASE_URL%/*}/${FUZZ_DATABASE:-payments_fuzz}
export PAYMENTS__LOG__FILTER=${PAYMENTS__LOG__FILTER:-warn}
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "$STARTED" ] && scripts/postgres.sh down "$STARTED"
  return 0
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() {
  for _ in $(seq 1 200); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  say "$1 did not answer"; return 1
}

# Made afresh each run: it holds only what the last run left, and one migrated by an earlier build
# would make `migrate` refuse to start.
PSQL=$(command -v psql || ls /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -n 1)
"$PSQL" "${DATABASE_URL%/*}/postgres" -XAq \
  -c "DROP DATABASE IF EXISTS \"${FUZZ_DATABASE:-payments_fuzz}\"" >/dev/null
"$BIN/payments-api" migrate
KEY=$("$BIN/payments-api" accounts create --name fuzz)
SIM_PORT=$(free_port)
"$BIN/processor-sim" --port "$SIM_PORT" >target/fuzz-sim.log 2>&1 &
PIDS+=($!)
wait_for "http://127.0.0.1:$SIM_PORT/_sim/stats"
API_PORT=$(free_port)
# The database is made afresh: a fresh key seals its endpoints' secrets.
PAYMENTS__HTTP__PORT=$API_PORT PAYMENTS__PROCESSOR__BASE_URL=http://127.0.0.1:$SIM_PORT \
  PAYMENTS__RATE_LIMIT__PER_SECOND=0 PAYMENTS__RATE_LIMIT__ANONYMOUS_PER_SECOND=0 \
  PAYMENTS__WORKER__METRICS_PORT=0 PAYMENTS__HTTP__ADMIN_PORT=0 \
  PAYMENTS__WEBHOOKS__SEALING_KEY=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n') \
  "$BIN/payments-api" serve >target/fuzz-api.log 2>&1 &
PIDS+=($!)
wait_for "http://127.0.0.1:$API_PORT/readyz"

SEED_ARGS=()
[ -n "${FUZZ_SEED:-}" ] && SEED_ARGS=(--seed "$FUZZ_SEED")
say "$EXAMPLES examples per operation against http://127.0.0.1:$API_PORT/openapi.json"
status=0
# schemathesis keeps a cache of past failures in .schemathesis/ of its working directory. One
# worker: with two threads, hypothesis parses lambdas' source concurrently and CPython 3.11's ast
# module can fail with "AST constructor recursion depth mismatch" (an error of the tool, not of
# the server, seen here once in four runs).
(cd target && PYTHONPATH="$ROOT/scripts" SCHEMATHESIS_HOOKS=fuzz_hooks \
  "$VENV/bin/schemathesis" run "http://127.0.0.1:$API_PORT/openapi.json" \
  --header "Authorization: Bearer $KEY" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
  --max-examples "$EXAMPLES" --workers 1 --generation-database none --no-color \
  --generation-allow-x00 true --generation-codec utf-8 \
  --report junit --report-dir fuzz-report "${SEED_ARGS[@]}") || status=$?
if [ "$status" != 0 ]; then
  say "failed; the server's log is target/fuzz-api.log"
  tail -n 20 target/fuzz-api.log >&2 || true
fi
exit "$status"
