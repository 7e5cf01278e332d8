#!/usr/bin/env bash
# `make stripe-sdk`: Stripe's own Python SDK (stripe-python, pinned in
# tests/stripe_sdk/requirements.txt) against processor-sim, through every endpoint the stand-in
# serves: tests/stripe_sdk/test_stand_in.py starts the stand-in on a free port and ends with
# "N passed, M failed"; this exits non-zero if any check failed.
#
# It builds nothing: it runs the processor-sim given as its first argument, or $PROCESSOR_SIM, or
# ${CARGO_TARGET_DIR:-target}/debug/processor-sim. The SDK goes into target/stripe-sdk-venv the
# first time, and again whenever the requirements file changes.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=$ROOT/target/stripe-sdk-venv
REQUIREMENTS=tests/stripe_sdk/requirements.txt
say() { echo "stripe-sdk: $*" >&2; }

SIM=${1:-${PROCESSOR_SIM:-${CARGO_TARGET_DIR:-target}/debug/processor-sim}}
if [ ! -x "$SIM" ]; then
  say "no processor-sim at $SIM; build it first (cargo build -p processor-sim)"
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

exec "$VENV/bin/python" tests/stripe_sdk/test_stand_in.py --bin "$SIM"
