#!/usr/bin/env bash
# Makes sure cargo finds a compiler for this checkout before a long build starts, in this order:
#   1. the toolchain rust-toolchain.toml pins, if rustup has it;
#   2. an installed toolchain of that version known by another name (`stable`, say), linked under
#      the pinned name (a symbolic link in rustup's toolchains folder: `rustup toolchain link`
#      refuses names that look like a release), so machines that reach no toolchain server work;
#   3. the pinned toolchain installed with rustup, as rustup itself would on first use;
#   4. where it cannot be had (no network), the newest installed stable that is newer, set for
#      this checkout with `rustup override set` (which rust-toolchain.toml does not outrank), and
#      said so in one line. Once the pinned one is there, the next run removes that override.
# Without rustup, the compiler on PATH is checked against the pin: newer warns, older fails.
# Anything else is one line that says what to do.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pinned=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$ROOT/rust-toolchain.toml")
say() { echo "toolchain.sh: $*" >&2; }
# Whether version $1 is at least version $2.
at_least() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]; }

if ! command -v rustup >/dev/null 2>&1; then
  command -v rustc >/dev/null 2>&1 || {
    say "no Rust compiler found: install rustup (https://rustup.rs), then run this again"
    exit 1
  }
  version=$(rustc -V | awk '{print $2}')
  [ "$version" = "$pinned" ] && exit 0
  if at_least "$version" "$pinned"; then
    say "warning: rust-toolchain.toml pins $pinned; using the rustc on PATH, $version, which is newer"
    exit 0
  fi
  say "rust-toolchain.toml pins $pinned and the rustc on PATH is $version: install rustup" \
    "(https://rustup.rs) or a newer Rust"
  exit 1
fi

# Run from outside the repository so that rust-toolchain.toml does not make rustup fetch it.
cd /
overridden() { rustup override list 2>/dev/null | awk -v p="$ROOT" '$1 == p {found=1} END {exit !found}'; }
have_pinned() {
  if rustup toolchain list | grep -q "^$pinned-"; then
    # An override an earlier run set for want of the pinned toolchain is no longer needed.
    if overridden; then
      say "the pinned $pinned is installed now; removing this checkout's rustup override"
      rustup override unset --path "$ROOT" >/dev/null 2>&1 || true
    fi
    return 0
  fi
  return 1
}
have_pinned && exit 0

installed=$(rustup toolchain list | awk '{print $1}')
for candidate in $installed; do
  version=$(rustup run "$candidate" rustc -V 2>/dev/null | awk '{print $2}') || continue
  if [ "$version" = "$pinned" ]; then
    sysroot=$(rustup run "$candidate" rustc --print sysroot)
    host=$(rustup run "$candidate" rustc -vV | sed -n 's/^host: //p')
    say "linking $candidate ($version) as $pinned-$host, the toolchain rust-toolchain.toml pins"
    ln -s "$sysroot" "${RUSTUP_HOME:-$HOME/.rustup}/toolchains/$pinned-$host"
    exit 0
  fi
done

say "installing Rust $pinned, which rust-toolchain.toml pins (rustup toolchain install)"
if rustup toolchain install "$pinned" --profile minimal --component clippy --component rustfmt \
     >/dev/null 2>&1 && have_pinned; then
  exit 0
fi

# The pinned one cannot be had here: the newest installed stable release that is newer will do.
best= best_version=
for candidate in $installed; do
  case $candidate in nightly* | beta*) continue ;; esac
  version=$(rustup run "$candidate" rustc -V 2>/dev/null | awk '{print $2}') || continue
  case $version in *-*) continue ;; esac # a pre-release
  if at_least "$version" "$pinned" && { [ -z "$best" ] || at_least "$version" "$best_version"; }; then
    best=$candidate best_version=$version
  fi
done
if [ -n "$best" ]; then
  rustup component add --toolchain "$best" clippy rustfmt >/dev/null 2>&1 || true
  rustup override set --path "$ROOT" "$best" >/dev/null 2>&1
  say "warning: Rust $pinned (rust-toolchain.toml) could not be installed; using $best" \
    "($best_version) for this checkout (rustup override unset --path $ROOT undoes it)"
  exit 0
fi
say "rust-toolchain.toml pins $pinned, which rustup could not install (no network?), and no" \
  "installed stable is as new: run \`rustup toolchain install $pinned\` where the network reaches" \
  "static.rust-lang.org"
exit 1
