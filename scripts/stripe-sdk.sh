#!/usr/bin/env bash
# `make stripe-sdk`: Stripe's own SDKs as judges of processor-sim. First the Python SDK
# (stripe-python, pinned in tests/stripe_sdk/requirements.txt) through every endpoint the
# stand-in serves: tests/stripe_sdk/test_stand_in.py starts the stand-in on a free port and ends
# with "N passed, M failed". Then the Node SDK (stripe-node, pinned in
# tests/stripe_sdk_node/package-lock.json) through every PaymentIntent flow:
# tests/stripe_sdk_node/stand-in.test.js, run by node's test runner, starts a stand-in of its own.
# Both also judge the provider's form fields: the top-level parameter names of each call it makes
# (`cargo run -p provider --example form_fields`, written to target/provider-form-fields.json, or
# the JSON file named by $PROVIDER_FORM_FIELDS) must be parameters that the SDK documents for that
# endpoint. Both always run; this exits non-zero if any check of either failed.
#
# It builds nothing but that small example (cargo run, nothing when it is fresh): it runs the
# processor-sim given as its first argument, or $PROCESSOR_SIM, or
# ${CARGO_TARGET_DIR:-target}/debug/processor-sim. The Python SDK goes into
# target/stripe-sdk-venv the first time, and again whenever the requirements file changes; the
# Node SDK (`npm ci` from a copy of the package folder) into target/stripe-sdk-node, again
# whenever the lock file changes.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case $TARGET in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
VENV=$TARGET/stripe-sdk-venv
REQUIREMENTS=tests/stripe_sdk/requirements.txt
NODE_DIR=$TARGET/stripe-sdk-node
NODE_SUITE=tests/stripe_sdk_node
say() { echo "stripe-sdk: $*" >&2; }

SIM=${1:-${PROCESSOR_SIM:-$TARGET/debug/processor-sim}}
case $SIM in /*) ;; *) SIM=$ROOT/$SIM ;; esac
if [ ! -x "$SIM" ]; then
  say "no processor-sim at $SIM; build it first (cargo build -p processor-sim)"
  exit 1
fi

# The provider's form fields, as its own constructors freeze them.
FORM_FIELDS=${PROVIDER_FORM_FIELDS:-}
if [ -z "$FORM_FIELDS" ]; then
  FORM_FIELDS=$TARGET/provider-form-fields.json
  say "the provider's form fields (cargo run -p provider --example form_fields)"
  SQLX_OFFLINE=true cargo run --quiet -p provider --example form_fields >"$FORM_FIELDS"
fi
case $FORM_FIELDS in /*) ;; *) FORM_FIELDS=$ROOT/$FORM_FIELDS ;; esac
if [ ! -s "$FORM_FIELDS" ]; then
  say "no form fields at $FORM_FIELDS"
  exit 1
fi

# The copy of the requirements inside the venv says what it holds.
if ! cmp -s "$REQUIREMENTS" "$VENV/requirements.txt" 2>/dev/null || [ ! -x "$VENV/bin/python" ]; then
  say "installing $(grep -v '^#' "$REQUIREMENTS" | tr '\n' ' ')into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$VENV/requirements.txt"
fi

# The package folder copied under target/ with its node_modules, installed again when the lock
# file changes; the test file is copied fresh each run (it must sit beside node_modules).
if ! cmp -s "$NODE_SUITE/package-lock.json" "$NODE_DIR/package-lock.json" 2>/dev/null ||
   [ ! -d "$NODE_DIR/node_modules" ]; then
  say "installing $NODE_SUITE's packages (npm ci) into $NODE_DIR"
  rm -rf "$NODE_DIR"
  mkdir -p "$NODE_DIR"
  cp "$NODE_SUITE/package.json" "$NODE_SUITE/package-lock.json" "$NODE_DIR/"
  (cd "$NODE_DIR" && npm ci --silent --no-audit --no-fund)
fi
find "$NODE_DIR" -maxdepth 1 -type f -name '*.js' -delete
cp "$NODE_SUITE"/*.js "$NODE_DIR/"

status=0
say "stripe-python (tests/stripe_sdk)"
"$VENV/bin/python" tests/stripe_sdk/test_stand_in.py --bin "$SIM" --form-fields "$FORM_FIELDS" || status=1
say "stripe-node $(cat "$NODE_DIR/node_modules/stripe/VERSION" 2>/dev/null) ($NODE_SUITE)"
(cd "$NODE_DIR" && PROCESSOR_SIM=$SIM PROVIDER_FORM_FIELDS=$FORM_FIELDS node --test) || status=1
exit $status
