#!/usr/bin/env bash
# `make diagrams` (and a step of `make test`): every fenced ```mermaid block in the repository's
# Markdown parsed by Mermaid's own parser, so that GitHub shows a picture, not an error box.
# Installs the pinned `mermaid` and `jsdom` of scripts/diagrams/package-lock.json with `npm ci`
# into target/diagram-check/ (again only when the lock file changes); needs node and npm.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SRC=scripts/diagrams
DIR=$ROOT/target/diagram-check

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "check-diagrams: $tool is needed (Node.js 18 or later)" >&2; exit 1; }
done

if ! cmp -s "$SRC/package-lock.json" "$DIR/package-lock.json" || [ ! -d "$DIR/node_modules/mermaid" ]; then
  echo "installing the pinned mermaid and jsdom into target/diagram-check" >&2
  rm -rf "$DIR" && mkdir -p "$DIR"
  cp "$SRC/package.json" "$SRC/package-lock.json" "$DIR/"
  (cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
cp "$SRC/check.mjs" "$DIR/check.mjs"

# The checker's own test: a known-broken block must fail, and at the right line.
if out=$(node "$DIR/check.mjs" "$SRC/broken.fixture" 2>&1); then
  echo "check-diagrams: the checker passed $SRC/broken.fixture, which must fail" >&2
  exit 1
fi
grep -q "^$SRC/broken.fixture:10: " <<<"$out" || {
  echo "check-diagrams: the checker did not name $SRC/broken.fixture line 10:" >&2
  echo "$out" >&2
  exit 1
}

# Every Markdown file of the repository, tracked or new, outside build output and dependencies.
mapfile -t files < <(find . \( -name target -o -name node_modules -o -name .git \) -prune -o \
  -type f -name '*.md' -print | sed 's|^\./||' | sort)
node "$DIR/check.mjs" "${files[@]}"
