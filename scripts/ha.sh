#!/usr/bin/env bash
# A highly available Postgres 15 on one machine, the standard setup of Patroni's documentation:
# one etcd member, two Postgres nodes under Patroni (streaming replication, synchronous by
# default), and HAProxy in front routing one port to whichever node Patroni's REST API calls the
# primary (`GET /primary`). `make ha-up`, `make ha-down` and `make proof-ha` use it.
#
# Usage: scripts/ha.sh up       install what is missing, start everything on fresh data, wait
#                               until the primary answers through HAProxy and the standby streams;
#                               prints `DATABASE_URL=…` (HAProxy's port) and the other addresses
#        scripts/ha.sh down     stop every process `up` started (bounded waits, then SIGKILL)
#        scripts/ha.sh status   Patroni's view of the cluster
#
# Everything comes from the package registries: etcd-server and haproxy from Debian's (apt-get,
# as root), Patroni and psycopg from PyPI into a virtualenv beside the data. Postgres' own
# binaries are the machine's (PG_BIN, default the newest /usr/lib/postgresql/*/bin).
# Initdb and postgres refuse to run as root, so as root Patroni runs as the `postgres` system user
# (runuser) on directories it owns; a normal user runs it as themselves.
# The machine's own Postgres (port 5432) is never touched: every port here is another one.
# HA_DIR, HA_PORT (HAProxy's primary port) and HA_SYNC (true|false, Patroni's synchronous_mode at
# bootstrap) change the defaults.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HA_DIR=${HA_DIR:-$ROOT/target/ha}
HA_PORT=${HA_PORT:-54330}
HA_SYNC=${HA_SYNC:-true}
ETCD_PORT=23791
ETCD_PEER_PORT=23801
PG_PORTS=(54331 54332)
REST_PORTS=(28008 28009)
STATS_PORT=28404
PATRONI_PIP=${PATRONI_PIP:-"patroni[etcd3]==4.1.5 psycopg[binary]==3.3.9"}

say() { echo "ha.sh: $*" >&2; }
die() { say "$*"; exit 1; }

is_root() { [ "$(id -u)" = 0 ]; }
as_owner() { if is_root; then runuser -u postgres -- "$@"; else "$@"; fi; }

pg_bin() {
  if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r | head -n1)
  [ -n "$dir" ] || dir=$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")
  [ -x "$dir/initdb" ] || die "no Postgres server binaries (apt-get install postgresql-15, or set PG_BIN)"
  echo "$dir"
}

# Waits up to $1 seconds for the command that follows to succeed; gives up at once when the
# process named by $WATCH (a name `spawn` recorded) has died.
wait_for() {
  local seconds=$1; shift
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    if [ -n "${WATCH:-}" ] && ! running "$WATCH"; then return 1; fi
    sleep 0.5
  done
}

install_packages() {
  local missing=()
  command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || missing+=(etcd-server)
  command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
  if [ ${#missing[@]} -gt 0 ]; then
    is_root || die "missing ${missing[*]}: run as root, or install them (apt-get install ${missing[*]})"
    say "installing ${missing[*]} with apt-get"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
  fi
  if [ ! -x "$HA_DIR/venv/bin/patroni" ] || ! as_owner "$HA_DIR/venv/bin/python3" -c '' 2>/dev/null; then
    say "installing Patroni from PyPI into $HA_DIR/venv"
    rm -rf "$HA_DIR/venv"
    local python
    python=$(owner_python) || die "no python3 that $(is_root && echo "the postgres user" || echo "you") can run (apt-get install python3)"
    if ! "$python" -m venv "$HA_DIR/venv" >&2; then
      is_root || die "$python has no venv module (apt-get install python3-venv)"
      apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >&2
      "$python" -m venv "$HA_DIR/venv" >&2
    fi
    # shellcheck disable=SC2086 # the list is meant to split
    "$HA_DIR/venv/bin/pip" install -q $PATRONI_PIP >&2
  fi
}

# A python3 that the user running Patroni can execute: as root, the postgres user cannot reach an
# interpreter under root's home (pyenv, say), so the system's comes first.
owner_python() {
  local candidate
  for candidate in /usr/bin/python3 "$(command -v python3 2>/dev/null)"; do
    [ -n "$candidate" ] && as_owner "$candidate" -c '' 2>/dev/null && { echo "$candidate"; return 0; }
  done
  return 1
}

etcd_bin() { command -v etcd 2>/dev/null || echo /usr/bin/etcd; }
haproxy_bin() { command -v haproxy 2>/dev/null || echo /usr/sbin/haproxy; }

# Starts a command detached in its own session, its output in $1.log and its pid in $1.pid.
spawn() {
  local name=$1; shift
  setsid "$@" >"$HA_DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$HA_DIR/$name.pid"
}

patroni_config() {
  local n=$1 pg_port=${PG_PORTS[$1]} rest_port=${REST_PORTS[$1]} dir=$HA_DIR/pg$1
  cat <<YAML
scope: payments-ha
namespace: /payments-ha/
name: pg$n
log:
  level: INFO
restapi:
  listen: 127.0.0.1:$rest_port
  connect_address: 127.0.0.1:$rest_port
etcd3:
  hosts: 127.0.0.1:$ETCD_PORT
bootstrap:
  dcs:
    # Leader key lifetime and loop: the floor Patroni accepts for ttl is 20 s; a crash of the
    # primary's postmaster is handled at once (primary_start_timeout 0), not after the TTL.
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    primary_start_timeout: 0
    # Synchronous replication is the production setting (docs/failover.md); the proof also
    # runs with it off, to count what is lost.
    synchronous_mode: $HA_SYNC
    synchronous_mode_strict: false
    # Let an asynchronous standby that is behind be promoted anyway (what the proof measures).
    maximum_lag_on_failover: 1073741824
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        synchronous_commit: "on"
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_connections: 200
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        # The server's side of a connection whose client vanished without a word (a crashed API
        # host): found dead within about 25 s and its transaction rolled back, its row locks freed.
        tcp_keepalives_idle: 10
        tcp_keepalives_interval: 5
        tcp_keepalives_count: 3
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host replication all 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$pg_port
  connect_address: 127.0.0.1:$pg_port
  data_dir: $dir/data
  bin_dir: $(pg_bin)
  pgpass: $dir/pgpass
  # An old primary that wrote WAL its successor never received (asynchronous replication) is
  # rewound, or cloned again if that fails, so the cluster heals by itself after every round.
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
    rewind:
      username: postgres
      password: postgres
  parameters:
    unix_socket_directories: $dir
tags: {}
YAML
}

haproxy_config() {
  cat <<CFG
# Generated by scripts/ha.sh: one port for the primary, chosen by Patroni's REST health check.
global
  maxconn 2000
defaults
  mode tcp
  timeout connect 2s
  timeout client 30m
  timeout server 30m
  timeout check 1s
listen primary
  bind 127.0.0.1:$HA_PORT
  option httpchk GET /primary
  http-check expect status 200
  # A node that stops being the primary has its sessions cut at once, so no client keeps
  # writing to a demoted node (it would answer read-only errors, or nothing at all).
  default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
  server pg0 127.0.0.1:${PG_PORTS[0]} maxconn 300 check port ${REST_PORTS[0]}
  server pg1 127.0.0.1:${PG_PORTS[1]} maxconn 300 check port ${REST_PORTS[1]}
listen stats
  mode http
  bind 127.0.0.1:$STATS_PORT
  stats enable
  stats uri /
CFG
}

running() { [ -f "$HA_DIR/$1.pid" ] && kill -0 "$(cat "$HA_DIR/$1.pid")" 2>/dev/null; }

primary_answers() {
  "$(pg_bin)/psql" -h 127.0.0.1 -p "$HA_PORT" -U postgres -d postgres -tAc \
    "SELECT NOT pg_is_in_recovery()" 2>/dev/null | grep -q t
}

standby_streams() {
  curl -fsS "http://127.0.0.1:${REST_PORTS[0]}/cluster" 2>/dev/null |
    python3 -c 'import json,sys; m=json.load(sys.stdin)["members"]; sys.exit(0 if len(m)==2 and any(x["role"]!="leader" and x["state"]=="streaming" for x in m) else 1)'
}

up() {
  mkdir -p "$HA_DIR"
  # A start that fails half way stops what it started.
  trap 'status=$?; [ $status = 0 ] || { say "stopping what was started"; down; }' EXIT
  for name in etcd haproxy patroni0 patroni1; do
    running "$name" && die "$name is already running: make ha-down first"
  done
  install_packages
  # Fresh data every time: the proof starts from a cluster nobody has written to.
  rm -rf "$HA_DIR/etcd" "$HA_DIR/pg0" "$HA_DIR/pg1"
  mkdir -p "$HA_DIR/etcd" "$HA_DIR/pg0" "$HA_DIR/pg1"
  if is_root; then
    id postgres >/dev/null 2>&1 || die "running as root, and there is no 'postgres' user to run Postgres as"
    as_owner test -x "$HA_DIR" || die "the postgres user cannot reach $HA_DIR: set HA_DIR to a directory it can reach"
    chown postgres "$HA_DIR/pg0" "$HA_DIR/pg1"
    chmod 700 "$HA_DIR/pg0" "$HA_DIR/pg1"
  fi

  say "starting etcd on 127.0.0.1:$ETCD_PORT"
  spawn etcd "$(etcd_bin)" --name ha --data-dir "$HA_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "ha=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state new
  WATCH=etcd wait_for 30 curl -fsS "http://127.0.0.1:$ETCD_PORT/health" || die "etcd did not start: $(tail -5 "$HA_DIR/etcd.log")"

  for n in 0 1; do
    patroni_config "$n" > "$HA_DIR/pg$n/patroni.yml"
    is_root && chown postgres "$HA_DIR/pg$n/patroni.yml"
    say "starting Patroni pg$n (Postgres on 127.0.0.1:${PG_PORTS[$n]}, REST on ${REST_PORTS[$n]})"
    if is_root; then
      spawn "patroni$n" runuser -u postgres -- "$HA_DIR/venv/bin/patroni" "$HA_DIR/pg$n/patroni.yml"
    else
      spawn "patroni$n" "$HA_DIR/venv/bin/patroni" "$HA_DIR/pg$n/patroni.yml"
    fi
    # The first node bootstraps the cluster before the second one clones it.
    if [ "$n" = 0 ]; then
      WATCH=patroni0 wait_for 90 curl -fsS "http://127.0.0.1:${REST_PORTS[0]}/primary" ||
        die "pg0 did not become the primary: $(tail -20 "$HA_DIR/patroni0.log")"
    fi
  done

  haproxy_config > "$HA_DIR/haproxy.cfg"
  say "starting HAProxy: the primary on 127.0.0.1:$HA_PORT, stats on http://127.0.0.1:$STATS_PORT/"
  spawn haproxy "$(haproxy_bin)" -db -f "$HA_DIR/haproxy.cfg"
  WATCH=haproxy wait_for 60 primary_answers || die "the primary does not answer through HAProxy: $(tail -5 "$HA_DIR/haproxy.log")"
  WATCH=patroni1 wait_for 120 standby_streams || die "the standby does not stream: $(tail -20 "$HA_DIR/patroni1.log")"
  trap - EXIT
  say "up: synchronous_mode=$HA_SYNC"
  echo "DATABASE_URL=postgres://postgres@127.0.0.1:$HA_PORT/postgres"
  echo "HA_PATRONI=http://127.0.0.1:${REST_PORTS[0]},http://127.0.0.1:${REST_PORTS[1]}"
  echo "HA_DATA=$HA_DIR/pg0/data,$HA_DIR/pg1/data"
}

# Stops one process (and its session's children) by the pid `up` recorded: SIGTERM, a bounded
# wait, then SIGKILL.
stop() {
  local name=$1 pid
  [ -f "$HA_DIR/$name.pid" ] || return 0
  pid=$(cat "$HA_DIR/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping $name ($pid)"
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$HA_DIR/$name.pid"
}

# A postmaster left behind (Patroni killed, say), found by its pid file, never by name.
stop_postgres() {
  local data=$1 pid
  [ -f "$data/postmaster.pid" ] || return 0
  pid=$(head -n1 "$data/postmaster.pid")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    say "stopping the postmaster of $data ($pid)"
    as_owner "$(pg_bin)/pg_ctl" -D "$data" -m immediate -w -t 20 stop >/dev/null 2>&1 || kill -KILL "$pid" 2>/dev/null || true
  fi
}

down() {
  [ -d "$HA_DIR" ] || return 0
  stop haproxy
  stop patroni1
  stop patroni0
  stop_postgres "$HA_DIR/pg1/data"
  stop_postgres "$HA_DIR/pg0/data"
  stop etcd
  say "down"
}

status() {
  curl -fsS "http://127.0.0.1:${REST_PORTS[0]}/cluster" 2>/dev/null ||
    curl -fsS "http://127.0.0.1:${REST_PORTS[1]}/cluster" ||
    say "no Patroni answers"
  echo
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up | down | status" >&2; exit 2 ;;
esac
