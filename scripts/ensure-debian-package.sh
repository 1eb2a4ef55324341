#!/usr/bin/env bash
# ensure-debian-package.sh PACKAGE WHAT COMMAND...: makes sure every COMMAND is on PATH, for the
# tests that run it (setup-prometheus.sh, setup-chromium.sh).
#
# Already on PATH: nothing to do. Otherwise Debian's PACKAGE is installed when apt-get is there
# and may be used (as root, or through sudo without a password); anywhere else this stops at once
# with one line that says what to install. WHAT says what the package is for, in the log line.
set -euo pipefail

package=$1 what=$2
shift 2
name="setup-$package"

on_path() {
  local cmd
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null 2>&1 || return 1
  done
}

if on_path "$@"; then
  exit 0
fi

can_install=no
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=""; can_install=yes
  elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    sudo="sudo -n"; can_install=yes
  fi
fi

if [ "$can_install" = yes ]; then
  echo "$name: installing Debian's $package package ($what)"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "$package" >/dev/null
  if on_path "$@"; then
    exit 0
  fi
fi

echo "$name: the tests need $* on PATH: install Debian's or Ubuntu's package '$package'" \
  "(apt-get install $package), then run make test again" >&2
exit 1
