#!/usr/bin/env bash
# Makes sure `chromium` is on PATH for the test that opens report.html in a headless browser
# (tests/integration/test_report_browser.py); see ensure-debian-package.sh.
set -euo pipefail
exec bash "$(dirname "$0")/ensure-debian-package.sh" chromium "the headless browser the report test uses" chromium
