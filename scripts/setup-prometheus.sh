#!/usr/bin/env bash
# Makes sure `prometheus` and `promtool` are on PATH for the tests that start a real Prometheus
# (it scrapes the planner's exporter) and check docker/prometheus.yml; see ensure-debian-package.sh.
# The tests start their own Prometheus on a free loopback port; a system service the package may
# start on machines with an init system is not used.
set -euo pipefail
exec bash "$(dirname "$0")/ensure-debian-package.sh" prometheus "prometheus and promtool" prometheus promtool
