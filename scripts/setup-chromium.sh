#!/usr/bin/env bash
# Makes sure `chromium` is on PATH for the test that opens report.html in a headless browser
# (tests/integration/test_report_html_browser.py).
#
# Already on PATH: nothing to do. Otherwise Debian's `chromium` package is installed when apt-get
# is there and may be used (as root, or through sudo without a password); anywhere else this stops
# at once with one line that says what to install.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
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
  echo "setup-chromium: installing Debian's chromium package (the headless browser the report test uses)"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
  if command -v chromium >/dev/null 2>&1; then
    exit 0
  fi
fi

echo "setup-chromium: the tests need chromium on PATH: install Debian's or Ubuntu's package" \
  "'chromium' (apt-get install chromium), then run make test again" >&2
exit 1
