#!/usr/bin/env bash
# The minimum supported Rust version (MSRV), checked:
# 1. every crate of the workspace declares `rust-version`, and they all declare the same one;
# 2. the library, the command and the testkit build with that toolchain (`cargo +MSRV check`).
#
# Step 2 installs the toolchain with rustup when it is missing (about 15 s, the minimal profile)
# and resolves the dependencies afresh in a copy of the workspace, without the dev-dependencies
# and with cargo's MSRV-aware resolver: what a user on that toolchain gets, since a user's build
# never sees our dev-dependencies (the committed Cargo.lock is resolved for the newest toolchain,
# and the benchmarks' rslock pulls a newer tokio). The first run builds every dependency (about
# 2.5 min on 2 cores); later runs reuse target/msrv. FREDLOCK_MSRV_BUILD=0 skips step 2 (offline).
set -euo pipefail
cd "$(dirname "$0")/.."

# 1. One rust-version, declared by every member.
manifests=$(cargo metadata --no-deps --format-version 1 \
  | grep -o '"manifest_path":"[^"]*"' | sed 's/^"manifest_path":"//; s/"$//')
msrv=""
for manifest in $manifests; do
  declared=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' "$manifest")
  if [ -z "$declared" ]; then
    echo "msrv: $manifest declares no rust-version: add rust-version = \"...\" to its [package]" >&2
    exit 1
  fi
  if [ -z "$msrv" ]; then
    msrv=$declared
  elif [ "$declared" != "$msrv" ]; then
    echo "msrv: $manifest declares rust-version $declared, another member $msrv: declare one MSRV" >&2
    exit 1
  fi
done
echo "msrv: every crate declares rust-version $msrv"

# 2. The crates build with that toolchain.
if [ "${FREDLOCK_MSRV_BUILD:-1}" = 0 ]; then
  echo "msrv: FREDLOCK_MSRV_BUILD=0: not building with Rust $msrv"
  exit 0
fi
if ! command -v rustup >/dev/null 2>&1; then
  echo "msrv: rustup is missing: cannot build with Rust $msrv (FREDLOCK_MSRV_BUILD=0 skips this)" >&2
  exit 1
fi
if ! rustup run "$msrv" cargo --version >/dev/null 2>&1; then
  rustup toolchain install "$msrv" --profile minimal
fi
repo=$PWD
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
# The tracked files as they are in the working tree (a file deleted there is left out).
git ls-files -z | while IFS= read -r -d '' f; do
  if [ -e "$f" ]; then printf '%s\0' "$f"; fi
done | xargs -0 cp --parents -t "$copy"
for manifest in $manifests; do
  relative=${manifest#"$repo"/}
  # Drop the [dev-dependencies] table: everything from its header to the next table.
  awk '/^\[/ { skip = ($0 == "[dev-dependencies]") } !skip' "$manifest" > "$copy/$relative"
done
rm -f "$copy/Cargo.lock"
(cd "$copy" && CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback cargo generate-lockfile --quiet)
(cd "$copy" && CARGO_TARGET_DIR="$repo/target/msrv" \
  cargo "+$msrv" check --workspace --all-features --lib --bins --quiet)
echo "msrv: the workspace builds with Rust $msrv"
