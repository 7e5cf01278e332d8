# The two commands of the quick start are `make run` and `make test`; the rest are helpers.
.PHONY: run test demo-crash diagrams proof proof-ha ha-up ha-down bench bench-scale fuzz-api stripe-sdk stand-in-examples fmt lint db-up db-down sqlx-prepare schema help

help:
	@echo "make run           start Postgres (if needed), the API and friends, print a demo key"
	@echo "make test          everything CI runs: fmt, clippy, offline build, all tests"
	@echo "make demo-crash    a payment killed between its phases, seen in the inspector, finished by its retry"
	@echo "make proof         the fault matrix at a larger scale (PROOF_SCALE=5, PROOF_SEED=…)"
	@echo "make proof-ha      a Postgres failover under load (Patroni, etcd, HAProxy), synchronous and not"
	@echo "make ha-up|ha-down start or stop that cluster under target/ha (HAProxy's primary on 54330)"
	@echo "make bench         throughput, latency, statements and memory against the pgbench floor"
	@echo "make bench-scale   the same speed with a year of payments behind it (FILL=1000000; 10000000 for ten million)"
	@echo "make diagrams      every mermaid block in the Markdown parsed by Mermaid's own parser"
	@echo "make fuzz-api      schemathesis against /openapi.json (100 per operation; FUZZ_EXAMPLES=500 for a long run)"
	@echo "make stripe-sdk    Stripe's Python and Node SDKs against processor-sim (every endpoint; every PaymentIntent flow)"
	@echo "make stand-in-examples  the example suites in examples/ (pytest, node --test) driving processor-sim"
	@echo "make fmt           format the code"
	@echo "make lint          clippy, cargo deny and cargo machete"
	@echo "make sqlx-prepare  refresh .sqlx/ after changing a query (needs a migrated DATABASE_URL)"
	@echo "make schema        rewrite docs/schema.sql from a freshly migrated scratch database"
	@echo "make db-up|db-down start or stop the private Postgres cluster under target/"

run:
	@scripts/run.sh

test:
	@scripts/test.sh

# docs/watching-it.md: a payment killed at a failpoint after the processor charged, the key in the
# inspector at its recovery point, the retry finishing it with one charge. Builds with failpoints.
demo-crash:
	@scripts/demo-crash.sh

# Every fenced mermaid block of the repository's Markdown parsed by Mermaid (pinned in
# scripts/diagrams/, installed into target/diagram-check with npm). `make test` runs it.
diagrams:
	@scripts/check-diagrams.sh

# The fault matrix of tests/tests/proof/mod.rs with more requests and another seed. `make test` runs
# it at scale 1.
PROOF_SCALE ?= 5
PROOF_SEED ?= $(shell date +%s)
proof:
	@scripts/toolchain.sh
	SQLX_OFFLINE=true cargo build --workspace --all-targets
	@eval "$$(scripts/postgres.sh up | sed 's/^/export /')" && \
	  PROOF_SCALE=$(PROOF_SCALE) PROOF_SEED=$(PROOF_SEED) SQLX_OFFLINE=true \
	  cargo test -p payments-tests --test e2e -- --test-threads 2 proof:: leases:: && \
	  PROOF_SCALE=$(PROOF_SCALE) SQLX_OFFLINE=true \
	  cargo test -p payments-worker --test worker -- brown_out

# Never part of `make test`. etcd, two Postgres nodes under Patroni and HAProxy (scripts/ha.sh;
# installs what is missing from Debian's packages and PyPI), then the failover proof of
# tests/tests/failover.rs in four rounds, then the cluster stopped whatever the outcome.
# Takes 3 to 5 minutes after the first install. docs/failover.md has the results.
ha-up:
	@scripts/ha.sh up

ha-down:
	@scripts/ha.sh down

proof-ha:
	@scripts/toolchain.sh
	SQLX_OFFLINE=true cargo build -p payments-api -p payments-worker -p processor-sim --bins
	SQLX_OFFLINE=true cargo test -p payments-tests --test e2e --no-run
	@scripts/ha.sh down
	@status=0; \
	  env=$$(scripts/ha.sh up) || exit 1; \
	  export HA_DATABASE_URL=$$(echo "$$env" | sed -n 's/^DATABASE_URL=//p') \
	         HA_PATRONI=$$(echo "$$env" | sed -n 's/^HA_PATRONI=//p'); \
	  SQLX_OFFLINE=true cargo test -p payments-tests --test e2e -- --ignored --nocapture --test-threads 1 failover:: || status=$$?; \
	  scripts/ha.sh down; exit $$status

# Never part of `make test`. A private PostgreSQL server with pg_stat_statements, release builds,
# one table on standard output and in target/bench/results.md. ARGS go to payments-bench.
bench:
	@scripts/bench.sh $(ARGS)

# Never part of `make test`. `make bench` on the fresh database and again once it holds FILL
# payments as a year of use leaves them (crates/bench/src/scale.rs): every scenario at 32
# connections, the reads' rows per row returned, the reaper with a backlog, bytes per payment.
# About 15 minutes at a million, 45 at ten million (and 40 GB of disk). BENCHMARKS.md, "At scale".
FILL ?= 1000000
bench-scale:
	@scripts/bench.sh --fill $(FILL) --connections 32 --scenarios new,replay,storm,get,list,events $(ARGS)

# schemathesis (installed into target/fuzz-venv) against the live server's document: no 5xx, and
# every answer as documented. `make test` runs it with 10 examples per operation and a fixed seed.
FUZZ_EXAMPLES ?= 100
fuzz-api:
	@FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) scripts/fuzz-api.sh

# stripe-python (pinned in tests/stripe_sdk/requirements.txt, installed into
# target/stripe-sdk-venv), then stripe-node (pinned in tests/stripe_sdk_node/package-lock.json,
# installed with npm ci into target/stripe-sdk-node) against the stand-in. `make test` runs it
# after the tests.
stripe-sdk:
	@scripts/toolchain.sh
	SQLX_OFFLINE=true cargo build -p processor-sim
	@scripts/stripe-sdk.sh

# examples/stand-in-python (pytest, stripe-python) and examples/stand-in-node (node --test,
# stripe-node), each starting processor-sim, resetting it, aiming faults and moving its clock.
# Dependencies go into target/examples-venv and target/examples-node. `make test` runs them.
stand-in-examples:
	@scripts/toolchain.sh
	SQLX_OFFLINE=true cargo build -p processor-sim
	@scripts/stand-in-examples.sh

fmt:
	@scripts/toolchain.sh
	cargo fmt --all

# clippy, then the dependency checks (scripts/deps.sh: cargo deny and cargo machete, installed
# if missing; the advisory check runs only where RustSec's database on GitHub can be reached).
lint:
	@scripts/toolchain.sh
	SQLX_OFFLINE=true cargo clippy --workspace --all-targets -- -D warnings
	@scripts/deps.sh

db-up:
	@scripts/postgres.sh up

db-down:
	@scripts/postgres.sh down cluster

# Regenerates the offline query data from a live, migrated database. The sqlx macros write one
# file per query into SQLX_OFFLINE_DIR; touching the sources makes them run again.
sqlx-prepare:
	@scripts/toolchain.sh
	@test -n "$$DATABASE_URL" || { echo "set DATABASE_URL to a migrated database"; exit 1; }
	rm -rf .sqlx && mkdir -p .sqlx
	find crates tests -name '*.rs' -exec touch {} +
	SQLX_OFFLINE=false SQLX_OFFLINE_DIR=$(CURDIR)/.sqlx cargo check --workspace --all-targets --quiet
	@echo "wrote $$(ls .sqlx | wc -l) queries to .sqlx/"

# docs/schema.sql, the schema the migrations make, dumped from a scratch database on DATABASE_URL's
# server (or the one scripts/postgres.sh finds). `make test` fails when it is out of date.
schema:
	@scripts/schema.sh write
