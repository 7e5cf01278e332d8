#!/usr/bin/env bash
# `make stand-in-examples`: the two example test suites of examples/ (pytest with stripe-python,
# node's test runner with stripe-node), each paying with PaymentIntents against processor-sim on a
# free port, resetting it before each test, aiming faults, moving its clock and completing a 3-D
# Secure authentication. Exits non-zero if either fails.
#
# It builds nothing: it runs the processor-sim given as its first argument, or $PROCESSOR_SIM, or
# ${CARGO_TARGET_DIR:-target}/debug/processor-sim. Each suite's dependencies go under target/ the
# first time, and again whenever its pinned list changes: Python's into target/examples-venv,
# Node's (`npm ci` from a copy of the package folder) into target/examples-node.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case $TARGET in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
say() { echo "stand-in-examples: $*" >&2; }

SIM=${1:-${PROCESSOR_SIM:-$TARGET/debug/processor-sim}}
case $SIM in /*) ;; *) SIM=$ROOT/$SIM ;; esac
if [ ! -x "$SIM" ]; then
  say "no processor-sim at $SIM; build it first (cargo build -p processor-sim)"
  exit 1
fi
export PROCESSOR_SIM=$SIM
# The suites start their own stand-in; one the caller points at would be reset by both.
unset STAND_IN_URL

# Python: a venv keyed by the requirements file (a copy inside it says what it holds).
VENV=$TARGET/examples-venv
REQUIREMENTS=examples/stand-in-python/requirements.txt
if ! cmp -s "$REQUIREMENTS" "$VENV/requirements.txt" 2>/dev/null || [ ! -x "$VENV/bin/python" ]; then
  say "installing $(grep -v '^#' "$REQUIREMENTS" | tr '\n' ' ')into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$VENV/requirements.txt"
fi

# Node: the package folder copied under target/ with its node_modules, installed again when the
# lock file changes; the tests themselves are run from there, fresh from examples/ each time.
NODE_DIR=$TARGET/examples-node
if ! cmp -s examples/stand-in-node/package-lock.json "$NODE_DIR/package-lock.json" 2>/dev/null ||
   [ ! -d "$NODE_DIR/node_modules" ]; then
  say "installing examples/stand-in-node's packages (npm ci) into $NODE_DIR"
  rm -rf "$NODE_DIR"
  mkdir -p "$NODE_DIR"
  cp examples/stand-in-node/package.json examples/stand-in-node/package-lock.json "$NODE_DIR/"
  (cd "$NODE_DIR" && npm ci --silent --no-audit --no-fund)
fi
find "$NODE_DIR" -maxdepth 1 -type f -name '*.js' -delete
cp examples/stand-in-node/*.js "$NODE_DIR/"

status=0
say "examples/stand-in-python (pytest, stripe-python)"
(cd examples/stand-in-python && "$VENV/bin/python" -m pytest -q -p no:cacheprovider) || status=1
say "examples/stand-in-node (node --test, stripe-node)"
(cd "$NODE_DIR" && node --test) || status=1
exit $status
