#!/usr/bin/env bash
# The dependency checks of `make lint` and `make test`: `cargo deny check` (advisories, licences,
# bans, sources; deny.toml) and `cargo machete` (dependencies no code uses). Each tool is
# installed at its pinned version with `cargo install --locked` when missing.
#
# cargo-deny's advisory database is a git repository on GitHub (RustSec's advisory-db). Where
# GitHub cannot be reached, as on the project's own machines, which reach only package registries,
# the advisories check cannot run: the script then runs the other three and prints a warning
# that says so. It runs all four wherever the database is reachable.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

CARGO_DENY_VERSION=0.20.2
CARGO_MACHETE_VERSION=0.9.2
ADVISORY_DB=https://github.com/rustsec/advisory-db

# ensure TOOL VERSION: `cargo install --locked` unless that version is already on PATH.
ensure() {
  local tool=$1 version=$2
  if ! "$tool" --version 2>/dev/null | grep -qF "$version"; then
    echo "deps.sh: installing $tool $version (cargo install --locked)" >&2
    cargo install --locked --quiet "$tool" --version "$version"
  fi
}
ensure cargo-deny "$CARGO_DENY_VERSION"
ensure cargo-machete "$CARGO_MACHETE_VERSION"

echo "deps.sh: cargo machete (unused dependencies)" >&2
cargo machete

if timeout 20 git ls-remote --exit-code "$ADVISORY_DB" HEAD >/dev/null 2>&1; then
  echo "deps.sh: cargo deny check (advisories, licenses, bans, sources)" >&2
  cargo deny --locked check --hide-inclusion-graph advisories licenses bans sources
else
  cat >&2 <<WARN

deps.sh: ##################################################################################
deps.sh: WARNING: the advisory check DID NOT RUN. RustSec's database ($ADVISORY_DB)
deps.sh: cannot be reached from this machine, so no dependency was checked for known
deps.sh: vulnerabilities. Run \`make lint\` where GitHub is reachable to check them.
deps.sh: ##################################################################################

WARN
  echo "deps.sh: cargo deny check (licenses, bans, sources)" >&2
  cargo deny --locked check --hide-inclusion-graph licenses bans sources
fi
