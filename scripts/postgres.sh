#!/usr/bin/env bash
# Finds or starts a PostgreSQL server for `make run` and `make test`, in this order:
#   1. the server at DATABASE_URL (default postgres://postgres@127.0.0.1:5432/payments), if it answers;
#   2. Docker Compose's `postgres` service, if a Docker engine is running;
#   3. a private cluster under target/ made with this machine's initdb and pg_ctl;
#   4. otherwise, a message saying what to install.
#
# Usage: scripts/postgres.sh up     prints `DATABASE_URL=…` and `PG_STARTED=cluster|compose|` on stdout
#        scripts/postgres.sh cluster   the private cluster only (what `make bench` uses)
#        scripts/postgres.sh down   stops the private cluster or the Compose service it started
# PAYMENTS_PG_DIR, PAYMENTS_PG_PORT and PAYMENTS_PG_OPTIONS (extra server options, `-c name=value`)
# change the private cluster's directory, port and settings.
# Messages go to standard error. Initdb and postgres refuse to run as root, so as root the private
# cluster runs as the `postgres` system user (via runuser) on a directory that user owns.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEFAULT_URL=postgres://postgres@127.0.0.1:5432/payments
CLUSTER_PORT=${PAYMENTS_PG_PORT:-54329}
CLUSTER_DIR=${PAYMENTS_PG_DIR:-$ROOT/target/pgdata}
COMPOSE_URL=postgres://postgres:postgres@127.0.0.1:5432/payments

say() { echo "postgres.sh: $*" >&2; }

# host and port of a postgres:// URL (defaults 127.0.0.1 and 5432)
url_host() { local rest=${1#*://}; rest=${rest#*@}; rest=${rest%%/*}; rest=${rest%%\?*}; local host=${rest%%:*}; echo "${host:-127.0.0.1}"; }
url_port() { local rest=${1#*://}; rest=${rest#*@}; rest=${rest%%/*}; rest=${rest%%\?*}; case $rest in *:*) echo "${rest##*:}";; *) echo 5432;; esac; }

find_pg_bin() {
  local name=$1 candidate
  if candidate=$(command -v "$name" 2>/dev/null); then echo "$candidate"; return 0; fi
  for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) /usr/local/pgsql/bin /opt/homebrew/bin /usr/local/bin; do
    if [ -x "$candidate/$name" ]; then echo "$candidate/$name"; return 0; fi
  done
  return 1
}

answers() {
  local host port
  host=$(url_host "$1"); port=$(url_port "$1")
  local isready
  if isready=$(find_pg_bin pg_isready); then
    "$isready" -q -h "$host" -p "$port" -t 3 >/dev/null 2>&1
  else
    timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port" >/dev/null 2>&1
  fi
}

docker_engine() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

# Runs a command as the cluster's owner: ourselves, or `postgres` when we are root.
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

cluster_dir() {
  # As root the cluster belongs to `postgres`, who must be able to reach the directory; a checkout
  # under a private home (mode 700) is not reachable, so fall back to a directory under /tmp.
  if [ "$(id -u)" = 0 ]; then
    mkdir -p "$CLUSTER_DIR"
    if ! runuser -u postgres -- test -x "$(dirname "$CLUSTER_DIR")" 2>/dev/null; then
      CLUSTER_DIR=/tmp/payments-pgdata-$(echo "$ROOT" | cksum | cut -d' ' -f1)
      say "the postgres user cannot reach $ROOT/target; using $CLUSTER_DIR instead"
      mkdir -p "$CLUSTER_DIR"
    fi
    chown postgres "$CLUSTER_DIR"
    chmod 700 "$CLUSTER_DIR"
  else
    mkdir -p "$CLUSTER_DIR"
  fi
  echo "$CLUSTER_DIR"
}

start_cluster() {
  local initdb pg_ctl dir
  initdb=$(find_pg_bin initdb) && pg_ctl=$(find_pg_bin pg_ctl) || return 1
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    say "running as root, and there is no 'postgres' user to run the private cluster as"
    return 1
  fi
  dir=$(cluster_dir)
  if [ ! -f "$dir/PG_VERSION" ]; then
    say "creating a private cluster in $dir"
    as_owner "$initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --no-instructions >/dev/null
  fi
  if ! as_owner "$pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    say "starting the private cluster on 127.0.0.1:$CLUSTER_PORT"
    as_owner "$pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 \
      -o "-p $CLUSTER_PORT -k $dir -c listen_addresses=127.0.0.1 ${PAYMENTS_PG_OPTIONS:-}" start >/dev/null
    echo "PG_STARTED=cluster"
  fi
  echo "DATABASE_URL=postgres://postgres@127.0.0.1:$CLUSTER_PORT/payments"
}

up() {
  local url=${DATABASE_URL:-$DEFAULT_URL}
  if answers "$url"; then
    echo "DATABASE_URL=$url"
    return 0
  fi
  say "nothing answers at $(url_host "$url"):$(url_port "$url")"
  if docker_engine; then
    say "starting Postgres with Docker Compose"
    docker compose -f "$ROOT/docker-compose.yml" up -d --wait postgres >&2
    echo "PG_STARTED=compose"
    echo "DATABASE_URL=$COMPOSE_URL"
    return 0
  fi
  if start_cluster; then return 0; fi
  cat >&2 <<'MSG'
postgres.sh: no PostgreSQL server could be found or started. Any one of these will do:
  - set DATABASE_URL to a running server (postgres://user:password@host:port/database);
  - install and start Docker (then `make run` uses docker-compose.yml);
  - install PostgreSQL's server programs (Debian/Ubuntu: apt-get install postgresql;
    Fedora: dnf install postgresql-server; macOS: brew install postgresql@16), so that a
    private cluster can be made under target/.
MSG
  return 1
}

down() {
  local started=${1:-cluster}
  case $started in
    cluster)
      local pg_ctl dir
      pg_ctl=$(find_pg_bin pg_ctl) || return 0
      dir=$(cluster_dir)
      if as_owner "$pg_ctl" -D "$dir" status >/dev/null 2>&1; then
        say "stopping the private cluster"
        as_owner "$pg_ctl" -D "$dir" -m fast -w stop >/dev/null
      fi ;;
    compose)
      say "stopping Docker Compose's postgres"
      docker compose -f "$ROOT/docker-compose.yml" stop postgres >&2 ;;
  esac
}

case ${1:-} in
  up) up ;;
  cluster) start_cluster ;;
  down) down "${2:-cluster}" ;;
  *) echo "usage: $0 up | cluster | down [cluster|compose]" >&2; exit 2 ;;
esac
