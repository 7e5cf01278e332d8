#!/usr/bin/env bash
# Retention of the event feed two ways, on the database a `make bench ARGS="--fill N"` run leaves
# in target/bench-pgdata (stopped): batched deletes from one table, as the worker does, against
# native partitions by day, dropped whole. BENCHMARKS.md ("Retention: batched deletes or
# partitions") has the figures and the choice.
#
#   crates/bench/pgbench/experiments/partitions.sh [SECONDS]
#
# It copies `events` twice, into a plain table with the same indexes (`events_plain`) and into
# a table partitioned by day of `created_at` (`events_by_day`: the primary key must then hold
# `created_at`, so an event id is unique per day only, and no foreign key can point at it), then:
# 1. the poll (`reads/events.sql`) and a GET of one event by id on each, with pgbench over
#    8 connections for SECONDS (default 10) each;
# 2. one day's events removed from each: from the plain table in batches of 1,000 in `seq`
#    order (the worker's statement shape) and the VACUUM that makes their space reusable,
#    against DETACH and DROP of the day's partition; the time and the WAL each writes.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)
SECONDS_EACH=${1:-10}
PORT=${PARTITIONS_PG_PORT:-54339}
DATA=$ROOT/target/bench-pgdata
[ -d "$DATA" ] || { echo "partitions.sh: no $DATA; run make bench ARGS=\"--fill 1000000\" first" >&2; exit 1; }
export PAYMENTS_PG_DIR=$DATA PAYMENTS_PG_PORT=$PORT
"$ROOT/scripts/postgres.sh" cluster >/dev/null
trap '"$ROOT/scripts/postgres.sh" down cluster' EXIT
PSQL=(psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d payments_bench)
PGBENCH=$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | sort -V | tail -1)
ACCOUNT=$("${PSQL[@]}" -Atc "SELECT account_id FROM events e JOIN bench_cursors c ON c.id = e.id LIMIT 1")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/partitions.XXXXXX")

echo "partitions.sh: copying $("${PSQL[@]}" -Atc "SELECT count(*) FROM events") events twice" >&2
"${PSQL[@]}" <<'SQL'
DROP TABLE IF EXISTS events_plain, events_by_day;
CREATE TABLE events_plain (LIKE events INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
INSERT INTO events_plain SELECT * FROM events;
ALTER TABLE events_plain ADD PRIMARY KEY (id), ADD UNIQUE (seq);
CREATE INDEX ON events_plain (account_id, (coalesce(xid, '0'::xid8)) DESC, seq DESC);
CREATE INDEX ON events_plain (account_id, type, (coalesce(xid, '0'::xid8)) DESC, seq DESC);

CREATE TABLE events_by_day (LIKE events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (created_at);
DO $$
DECLARE day date;
BEGIN
    FOR day IN SELECT generate_series(min(created_at)::date, max(created_at)::date + 1, '1 day')
                 FROM events LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF events_by_day FOR VALUES FROM (%L) TO (%L)',
                       'events_' || to_char(day, 'YYYYMMDD'), day, day + 1);
    END LOOP;
END $$;
INSERT INTO events_by_day SELECT * FROM events;
ALTER TABLE events_by_day ADD PRIMARY KEY (id, created_at);
CREATE INDEX ON events_by_day (seq);
CREATE INDEX ON events_by_day (account_id, (coalesce(xid, '0'::xid8)) DESC, seq DESC);
CREATE INDEX ON events_by_day (account_id, type, (coalesce(xid, '0'::xid8)) DESC, seq DESC);
VACUUM ANALYZE events_plain, events_by_day;
SQL

# The poll and the GET, on each table.
for table in events_plain events_by_day; do
  sed "s/FROM events/FROM $table/g" "$ROOT/crates/bench/pgbench/reads/events.sql" >"$WORK/poll-$table.sql"
  cat >"$WORK/get-$table.sql" <<SQL
\set c random(1, 2000)
SELECT * FROM $table
 WHERE id = (SELECT id FROM bench_cursors WHERE scenario = 'events' AND n = :c)
   AND account_id = :account;
SQL
done
echo "| read | table | tx/s | latency ms |"
echo "|---|---|---:|---:|"
for read in poll get; do
  for table in events_plain events_by_day; do
    out=$("$PGBENCH" -n -M prepared -c 8 -j 1 -T "$SECONDS_EACH" -D account="$ACCOUNT" -D ncursors=2000 \
            -f "$WORK/$read-$table.sql" -h 127.0.0.1 -p "$PORT" -U postgres payments_bench 2>&1)
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out")
    latency=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' <<<"$out")
    echo "| $read | $table | ${tps%.*} | $latency |"
  done
done

# One day's events, the oldest whole day, removed from each.
DAY=$("${PSQL[@]}" -Atc "SELECT min(created_at)::date + 1 FROM events_plain")
ROWS=$("${PSQL[@]}" -Atc "SELECT count(*) FROM events_plain WHERE created_at >= '$DAY' AND created_at < date '$DAY' + 1")
echo
echo "One day ($DAY, $ROWS events) removed:"
echo
echo "| how | seconds | WAL MiB |"
echo "|---|---:|---:|"
measure() { # label, SQL
  local wal0 t0 t1 wal1
  wal0=$("${PSQL[@]}" -Atc "SELECT pg_current_wal_lsn()")
  t0=$(date +%s.%N)
  "${PSQL[@]}" -c "$2"
  t1=$(date +%s.%N)
  wal1=$("${PSQL[@]}" -Atc "SELECT round(pg_wal_lsn_diff(pg_current_wal_lsn(), '$wal0') / 1048576.0, 1)")
  echo "| $1 | $(echo "$t1 - $t0" | bc -l | xargs printf '%.2f') | $wal1 |"
}
# Everything before the day goes first, unmeasured, so that the batches start at the day.
"${PSQL[@]}" -c "DELETE FROM events_plain WHERE created_at < '$DAY'" -c "VACUUM events_plain"
measure "batched deletes, 1,000 rows each, seq order" "DO \$\$
DECLARE n bigint;
BEGIN
  LOOP
    DELETE FROM events_plain WHERE seq IN (
        SELECT seq FROM events_plain ORDER BY seq LIMIT 1000)
      AND created_at < date '$DAY' + 1;
    GET DIAGNOSTICS n = ROW_COUNT;
    COMMIT;
    EXIT WHEN n = 0;
  END LOOP;
END \$\$"
measure "the VACUUM after them" "VACUUM events_plain"
PART="events_$(date -d "$DAY" +%Y%m%d)"
measure "DETACH and DROP of the day's partition" "ALTER TABLE events_by_day DETACH PARTITION $PART; DROP TABLE $PART"
"${PSQL[@]}" -c "DROP TABLE events_plain, events_by_day"
rm -rf "$WORK"
