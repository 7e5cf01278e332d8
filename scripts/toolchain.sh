#!/usr/bin/env bash
# Makes the toolchain that rust-toolchain.toml pins available to rustup without downloading
# anything: the project's machines reach no toolchain server, so when rustup knows the installed
# compiler only as `stable` (or another name) and its version is the pinned one, the script links
# it under the pinned name (a symbolic link in rustup's toolchains folder: `rustup toolchain link`
# refuses names that look like a release). Any other version is an error that says what to do.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pinned=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$ROOT/rust-toolchain.toml")
command -v rustup >/dev/null 2>&1 || exit 0 # a plain toolchain without rustup: nothing to link
# Run from outside the repository so that rust-toolchain.toml does not make rustup fetch it.
cd /
if rustup toolchain list | grep -q "^$pinned-"; then exit 0; fi
for candidate in $(rustup toolchain list | awk '{print $1}'); do
  version=$(rustup run "$candidate" rustc -V 2>/dev/null | awk '{print $2}') || continue
  if [ "$version" = "$pinned" ]; then
    sysroot=$(rustup run "$candidate" rustc --print sysroot)
    host=$(rustup run "$candidate" rustc -vV | sed -n 's/^host: //p')
    echo "toolchain.sh: linking $candidate ($version) as $pinned-$host, the toolchain rust-toolchain.toml pins" >&2
    ln -s "$sysroot" "${RUSTUP_HOME:-$HOME/.rustup}/toolchains/$pinned-$host"
    exit 0
  fi
done
echo "toolchain.sh: rust-toolchain.toml pins $pinned, and no installed toolchain is that version;" \
  "install it (rustup toolchain install $pinned) or raise the pin" >&2
exit 1
