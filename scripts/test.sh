#!/usr/bin/env bash
# `make test`: everything CI runs. Formatting, the guide's diagrams, lints, an offline build (which
# fails if `.sqlx/` is missing a query), and every test against a real Postgres.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export SQLX_OFFLINE=true

step() { printf '\n==> %s\n' "$*" >&2; }

step "prerequisites: node and npm, python3 with venv, psql, Postgres, a browser"
missing=0
need() { echo "missing: $*" >&2; missing=1; }
pg_bin() { command -v "$1" || ls /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1; }
# The diagram check, Stripe's Node SDK and the Node example suite.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  need "node and npm (Node.js 18 or later): apt-get install nodejs npm, or https://nodejs.org"
elif ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'; then
  need "Node.js 18 or later (found $(node --version)): https://nodejs.org"
fi
# Stripe's Python SDK, the Python example suite and schemathesis, each in a venv under target/.
if ! command -v python3 >/dev/null 2>&1; then
  need "python3 with venv: apt-get install python3 python3-venv"
elif ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need "python3's venv with pip (ensurepip): apt-get install python3-venv"
fi
# The transcripts' examples, and the check below for a database an earlier build migrated.
[ -n "$(pg_bin psql)" ] || need "psql, PostgreSQL's client: apt-get install postgresql-client"
# A server at DATABASE_URL, or Docker, or this machine's initdb (scripts/postgres.sh, below).
if [ -z "${DATABASE_URL:-}" ] && [ -z "$(pg_bin initdb)" ] && ! command -v docker >/dev/null 2>&1 &&
   ! timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5432' >/dev/null 2>&1; then
  need "PostgreSQL 15: a server on 127.0.0.1:5432 or at DATABASE_URL, Docker, or initdb" \
    "(apt-get install postgresql)"
fi
# The inspector's browser test (Debian's chromium), installed here where apt-get can.
has_browser() { command -v chromium || command -v chromium-browser || command -v google-chrome || command -v google-chrome-stable; } >/dev/null 2>&1
if ! has_browser && command -v apt-get >/dev/null 2>&1; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "installing chromium with apt-get" >&2
  $SUDO apt-get update -qq >/dev/null && \
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null || true
fi
# In CI, or wherever a browser is there, the browser test must run (not skip).
if has_browser || [ -n "${CI:-}" ]; then
  export PAYMENTS_REQUIRE_BROWSER=1
else
  echo "warning: no browser, so the inspector's browser test will be skipped:" \
    "apt-get install chromium (or put chromium or google-chrome on PATH)" >&2
fi
if [ "$missing" = 1 ]; then
  echo "make test needs the above first; the README's \"What you need\" lists every prerequisite" >&2
  exit 1
fi

step "the pinned toolchain (rust-toolchain.toml)"
scripts/toolchain.sh

step "cargo fmt --check"
cargo fmt --all --check

step "every mermaid diagram in the Markdown parses (make diagrams)"
scripts/check-diagrams.sh

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "dependency checks: cargo deny, cargo machete (make lint)"
scripts/deps.sh

step "offline build (proves .sqlx/ is current)"
cargo build --workspace --all-targets --locked

step "postgres"
callers_url=${DATABASE_URL:-}
pg_env=$(scripts/postgres.sh up)
export DATABASE_URL; DATABASE_URL=$(sed -n 's/^DATABASE_URL=//p' <<<"$pg_env")
PG_STARTED=$(sed -n 's/^PG_STARTED=//p' <<<"$pg_env")
if [ -n "$PG_STARTED" ]; then trap 'scripts/postgres.sh down "$PG_STARTED"' EXIT; fi
# A database migrated by an earlier build records migrations that migrations/ no longer has (or
# has changed), and `migrate` refuses it. The `payments` database that
# scripts/postgres.sh chose itself (or its default) is ours to drop, and `migrate` makes it again.
PSQL=$(command -v psql || ls /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -n 1 || true)
# A migration counts as the same when its version and its checksum (sqlx's: SHA-384 of the file)
# are: a baseline edited before a first release is a different migration under the same version.
current=$(for f in migrations/*.sql; do
  printf "(%s,'%s')," "$(basename "$f" | sed -E 's/_.*//')" "$(sha384sum "$f" | cut -d' ' -f1)"
done | sed 's/,$//')
stale=$("${PSQL:-psql}" "$DATABASE_URL" -XAtq -c "SELECT string_agg(m.version::text, ' ' ORDER BY m.version)
  FROM _sqlx_migrations m LEFT JOIN (VALUES $current) AS c (version, checksum)
    ON c.version = m.version AND c.checksum = encode(m.checksum, 'hex')
 WHERE c.version IS NULL" 2>/dev/null || true)
if [ -n "$stale" ]; then
  db=${DATABASE_URL##*/}
  if [ "$db" = payments ] && { [ "$DATABASE_URL" != "$callers_url" ] ||
       [ "$DATABASE_URL" = postgres://postgres@127.0.0.1:5432/payments ]; }; then
    echo "the payments database was migrated by an earlier build (versions $stale); dropping it" >&2
    "${PSQL:-psql}" "${DATABASE_URL%/payments}/postgres" -XAq -v ON_ERROR_STOP=1 -c 'DROP DATABASE payments'
  else
    echo "the database $db at DATABASE_URL was migrated by an earlier build (versions $stale," \
      "folded since into one baseline): drop it (\`migrate\` makes it again) or use another one" >&2
    exit 1
  fi
fi
# The test databases are created from this one; make sure it exists and is migrated.
"${CARGO_TARGET_DIR:-target}/debug/payments-api" migrate

step "docs/schema.sql matches a freshly migrated database"
scripts/schema.sh check

step "tests"
cargo test --workspace --locked --no-fail-fast

step "Stripe's Python and Node SDKs against processor-sim (make stripe-sdk)"
scripts/stripe-sdk.sh

step "the example suites that drive processor-sim: pytest and node --test (make stand-in-examples)"
scripts/stand-in-examples.sh

step "schema-driven fuzz run against /openapi.json (make fuzz-api, small and seeded)"
FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-10} FUZZ_SEED=${FUZZ_SEED:-1} scripts/fuzz-api.sh
