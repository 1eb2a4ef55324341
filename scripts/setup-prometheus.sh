#!/usr/bin/env bash
# Makes sure `prometheus` and `promtool` are on PATH for the tests that start a real Prometheus
# (it scrapes the planner's exporter) and check docker/prometheus.yml.
#
# Already on PATH: nothing to do. Otherwise Debian's `prometheus` package is installed when apt-get
# is there and may be used (as root, or through sudo without a password); anywhere else this stops
# at once with one line that says what to install.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
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
  echo "setup-prometheus: installing Debian's prometheus package (prometheus and promtool)"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # The tests start their own Prometheus on a free loopback port; a system service the package
  # may start on machines with an init system is not used.
  if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
  fi
fi

echo "setup-prometheus: the tests need prometheus and promtool on PATH: install Debian's or Ubuntu's package" \
  "'prometheus' (apt-get install prometheus) or Prometheus's release binaries, then run make test again" >&2
exit 1
