#!/usr/bin/env bash
# docs/schema.sql: the schema that migrations/ makes, as pg_dump prints it, checked in so that it
# can be read whole without replaying the migrations in one's head.
#
# Usage: scripts/schema.sh write   regenerates docs/schema.sql (`make schema`)
#        scripts/schema.sh check   fails, printing a diff, when docs/schema.sql is not what
#                                  migrations/ makes (`make test`)
# The server is DATABASE_URL's; its database is only connected to, never changed. Without
# DATABASE_URL, scripts/postgres.sh finds or starts one (and this stops what it started).
# migrations/*.sql are applied with psql, in file-name order and each in one transaction unless it
# opens with `-- no-transaction` (as sqlx applies them), to a scratch database of a unique name,
# which is dropped when the script ends. pg_dump must be of the server's major version or newer
# (an older one refuses the server); the one of the server's version is preferred, so that the
# output is the same on every machine.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SCHEMA=docs/schema.sql

say() { echo "schema.sh: $*" >&2; }

MODE=${1:-}
case $MODE in
  write|check) ;;
  *) echo "usage: $0 write | check" >&2; exit 2 ;;
esac

find_pg_bin() {
  local name=$1 candidate
  if candidate=$(command -v "$name" 2>/dev/null); then echo "$candidate"; return 0; fi
  for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) /usr/local/pgsql/bin /opt/homebrew/bin /usr/local/bin; do
    if [ -x "$candidate/$name" ]; then echo "$candidate/$name"; return 0; fi
  done
  return 1
}

# The major version of a PostgreSQL program (`pg_dump (PostgreSQL) 15.20 (Debian …)` is 15).
major_of() { "$1" --version 2>/dev/null | sed -nE 's/^[a-z_]+ \(PostgreSQL\) ([0-9]+).*/\1/p'; }

# The pg_dump of major version $1, or else the oldest installed one newer than it.
find_pg_dump() {
  local want=$1 candidate major best= best_major=
  for candidate in "$(command -v pg_dump 2>/dev/null || true)" \
      $(ls /usr/lib/postgresql/*/bin/pg_dump /usr/local/pgsql/bin/pg_dump /opt/homebrew/bin/pg_dump \
            /usr/local/bin/pg_dump 2>/dev/null || true); do
    [ -x "$candidate" ] || continue
    major=$(major_of "$candidate")
    [ -n "$major" ] || continue
    if [ "$major" = "$want" ]; then echo "$candidate"; return 0; fi
    if [ "$major" -gt "$want" ] && { [ -z "$best" ] || [ "$major" -lt "$best_major" ]; }; then
      best=$candidate best_major=$major
    fi
  done
  [ -n "$best" ] && echo "$best"
}

# The URL with its database replaced by $2 (its query string kept).
with_database() {
  local url=${1%%\?*} query=
  case $1 in *\?*) query="?${1#*\?}" ;; esac
  case ${url#*://} in */*) url=${url%/*} ;; esac
  echo "$url/$2$query"
}

PSQL=$(find_pg_bin psql) || { say "no psql found; install PostgreSQL's client programs"; exit 1; }

PG_STARTED=
SCRATCH=
WORK=$(mktemp -d)
cleanup() {
  if [ -n "$SCRATCH" ]; then
    "$PSQL" "$ADMIN_URL" -XAq -c "DROP DATABASE IF EXISTS \"$SCRATCH\" WITH (FORCE)" >/dev/null ||
      say "could not drop the scratch database $SCRATCH; drop it by hand"
  fi
  if [ -n "$PG_STARTED" ]; then scripts/postgres.sh down "$PG_STARTED"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ -n "${DATABASE_URL:-}" ]; then
  ADMIN_URL=$DATABASE_URL
else
  pg_env=$(scripts/postgres.sh up)
  PG_STARTED=$(sed -n 's/^PG_STARTED=//p' <<<"$pg_env")
  # Its `payments` database may not exist yet (`migrate` makes it); every server has `postgres`.
  ADMIN_URL=$(with_database "$(sed -n 's/^DATABASE_URL=//p' <<<"$pg_env")" postgres)
fi

server_num=$("$PSQL" "$ADMIN_URL" -XAtq -v ON_ERROR_STOP=1 -c 'SHOW server_version_num')
server_major=$((server_num / 10000))
PG_DUMP=$(find_pg_dump "$server_major") || {
  say "no pg_dump of PostgreSQL $server_major or newer found (the server is $server_major);"
  say "install PostgreSQL's client programs of that version"
  exit 1
}

# template0, so that whatever was added to template1 on this server stays out of the dump.
SCRATCH=payments_schema_$(date +%s)_$$_$RANDOM
"$PSQL" "$ADMIN_URL" -XAq -v ON_ERROR_STOP=1 -c "CREATE DATABASE \"$SCRATCH\" TEMPLATE template0" >/dev/null
SCRATCH_URL=$(with_database "$ADMIN_URL" "$SCRATCH")

for migration in migrations/*.sql; do
  one_transaction=(--single-transaction)
  if head -n 1 "$migration" | grep -q '^-- no-transaction'; then one_transaction=(); fi
  "$PSQL" "$SCRATCH_URL" -XAq -v ON_ERROR_STOP=1 "${one_transaction[@]}" -f "$migration" >/dev/null ||
    { say "$migration failed on a fresh database"; exit 1; }
done

# The dump, without what varies from one run or one machine to the next and says nothing of the
# schema: comments (pg_dump's own, with its version), blank lines, session settings, and the
# random key of `\restrict` (pg_dump 15.14 and later).
{
  cat <<'HEADER'
-- The schema that migrations/ makes: `pg_dump --schema-only --no-owner --no-privileges` of a
-- freshly migrated database, without pg_dump's comments, blank lines and session settings.
-- Generated by scripts/schema.sh (`make schema`); `make test` fails when it differs from what the
-- migrations make. Do not edit it: change or add a migration, then run `make schema`.
--
-- The idempotency engine's (crates/idem): the tables idempotency_keys and idempotency_attempts,
-- the domains idempotency_key, fingerprint, http_status and attempt_count, the types idem_fence
-- and idem_claimed, and the functions idem_advance, idem_finish, idem_commit_fence, idem_commit
-- and idem_claim (which reads api_keys and credentials_version). The rest is the payments
-- domain's (crates/domain): accounts, api_keys, verified_emails, credentials_version and its
-- trigger, payments, refunds, audit_events, jobs, receipts, events, webhook_endpoints,
-- webhook_attempts, processor_events, and their domains.
HEADER
  "$PG_DUMP" --schema-only --no-owner --no-privileges -d "$SCRATCH_URL" |
    grep -v -E '^(--|SET |SELECT pg_catalog\.set_config\(|\\restrict |\\unrestrict )' |
    grep -v -E '^[[:space:]]*$'
} >"$WORK/schema.sql"

case $MODE in
  write)
    cp "$WORK/schema.sql" "$SCHEMA"
    say "wrote $SCHEMA ($(wc -l <"$SCHEMA") lines; pg_dump $(major_of "$PG_DUMP"), server $server_major)"
    ;;
  check)
    if ! diff -u --label "$SCHEMA" --label "a freshly migrated database" "$SCHEMA" "$WORK/schema.sql"; then
      say "$SCHEMA is not the schema that migrations/ makes; run \`make schema\` (scripts/schema.sh write) and commit it"
      exit 1
    fi
    say "$SCHEMA is the schema that migrations/ makes"
    ;;
esac
