#!/usr/bin/env bash
# setup.sh: installs the Debian packages gpc needs to build, test and run its
# default job, only those that are missing. Needs root (or sudo) when
# something is missing; says so plainly otherwise.
#
#   scripts/setup.sh            build + run dependencies
#   scripts/setup.sh --test     also what the test suite uses
set -euo pipefail

packages=(build-essential cmake pkg-config libopenblas-dev libcmocka-dev fortunes
          libsqlite3-dev libmicrohttpd-dev libjansson-dev libinih-dev openmpi-bin libopenmpi-dev)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(python3 xz-utils clang libclang-rt-14-dev prometheus curl procps chromium slurm-wlm munge)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo)
else
  echo "setup: error: these Debian packages are missing and installing them needs root:" >&2
  echo "  apt-get install ${missing[*]}" >&2
  echo "Run that as root (or run 'make setup' as root), then run this command again." >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
