#!/usr/bin/env bash
# Instructions per pgbench transaction in the Postgres backend that serves SCRIPT: the way
# BENCHMARKS.md compares forms of the same SQL (sessions 15 and 16), since instruction counts
# repeat within 0.5 % from run to run where this host's throughput moves by ±15 %.
#
#   crates/bench/pgbench/experiments/callgrind.sh SCRIPT [TRANSACTIONS] [pgbench options...]
#
# It needs the database a `make bench` run leaves in target/bench-pgdata (stopped: `make bench`
# stops its server when it ends), starts that server under `valgrind --tool=callgrind` on port
# 54341 (as the directory's owner when run as root: postgres refuses to run as root), and runs
# SCRIPT twice with `--protocol=prepared` and the bench account's `account` and `key_hash` (as
# payments-bench sets them), each time over a connection of its own: WARMUP transactions (default
# 50), then WARMUP + TRANSACTIONS (default 400). A backend's first executions cost it far more
# than the rest (its caches are cold, and Postgres plans each statement afresh five times before
# it settles on a generic plan), so the difference of the two backends' counts, divided by
# TRANSACTIONS, is what a warm connection spends per transaction.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)
SCRIPT=$(realpath "$1")
TRANSACTIONS=${2:-400}
WARMUP=${WARMUP:-50}
shift $(($# < 2 ? $# : 2))
DATA=$ROOT/target/bench-pgdata
PORT=${CALLGRIND_PG_PORT:-54341}
DATABASE=${CALLGRIND_DATABASE:-payments_bench} # payments_bench_design for the design floor
BIN=$(pg_config --bindir 2>/dev/null || ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
[ -d "$DATA" ] || { echo "callgrind.sh: no $DATA; run make bench first" >&2; exit 1; }
[ -f "$DATA/postmaster.pid" ] && { echo "callgrind.sh: a server runs on $DATA; stop it first" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "callgrind.sh: needs valgrind" >&2; exit 1; }

as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u "$(stat -c %U "$DATA")" -- "$@"; else "$@"; fi; }
OUT=$(mktemp -d "${TMPDIR:-/tmp}/callgrind.XXXXXX")
chown "$(stat -c %U "$DATA")" "$OUT"
as_owner valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$OUT/cg.%p" \
  "$BIN/postgres" -D "$DATA" -p "$PORT" -c listen_addresses=127.0.0.1 \
  -c unix_socket_directories="$OUT" >"$OUT/postgres.log" 2>&1 &
stop() { as_owner "$BIN/pg_ctl" -D "$DATA" stop -m fast >/dev/null 2>&1 || true; }
trap stop EXIT
for _ in $(seq 1 120); do pg_isready -q -h 127.0.0.1 -p "$PORT" && break; sleep 1; done

psql=(psql -h 127.0.0.1 -p "$PORT" -U postgres -d payments_bench -XAtq)
account=$("${psql[@]}" -c "SELECT account_id FROM api_keys ORDER BY created_at LIMIT 1")
key_hash=$("${psql[@]}" -c "SELECT '\\x' || encode(key_hash, 'hex') FROM api_keys ORDER BY created_at LIMIT 1")
# The largest callgrind file that appeared while `pgbench -t $1` ran: the backend that served it
# (its file is written when it exits, as pgbench disconnects).
backend_instructions() {
  local before after file
  before=$(ls "$OUT"/cg.* | sort)
  "$BIN/pgbench" -h 127.0.0.1 -p "$PORT" -U postgres -n -c 1 -t "$1" --protocol=prepared \
    -D "account=$account" -D "key_hash=$key_hash" "${PGBENCH_ARGS[@]}" -f "$SCRIPT" "$DATABASE" \
    >"$OUT/pgbench.log" 2>&1 || { cat "$OUT/pgbench.log" >&2; exit 1; }
  grep -q "actually processed: $1/" "$OUT/pgbench.log" || { cat "$OUT/pgbench.log" >&2; exit 1; }
  sleep 2
  after=$(ls "$OUT"/cg.* | sort)
  file=$(comm -13 <(echo "$before") <(echo "$after") | xargs ls -S | head -1)
  sed -n 's/^totals: //p' "$file"
}
PGBENCH_ARGS=("$@")
warm=$(backend_instructions "$WARMUP")
total=$(backend_instructions $((WARMUP + TRANSACTIONS)))
echo "$(basename "$SCRIPT"): $(((total - warm) / TRANSACTIONS)) instructions per transaction" \
  "(backends' totals $warm for $WARMUP and $total for $((WARMUP + TRANSACTIONS)); files in $OUT)"
