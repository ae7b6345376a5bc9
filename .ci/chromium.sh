#!/usr/bin/env bash
# Install Debian's headless-capable Chromium and its WebDriver for the report's browser test
# (tests/test_report_browser.py), which skips without them:
#
#   bash .ci/chromium.sh          # installs /usr/bin/chromium and /usr/bin/chromedriver when missing
#
# Runs as root (CI and the developers' machines). Idempotent: does nothing when both are installed.
# Progress goes to stderr; the last line on stdout is the installed version.
set -euo pipefail

log() { echo "chromium.sh: $*" >&2; }

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    /usr/bin/chromium --version
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    log "run me as root (I install Debian packages)"
    exit 1
fi

log "installing chromium and chromium-driver"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# fonts-liberation: the report's text in a sans-serif with real metrics (the screenshot reads well)
apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-liberation >&2
/usr/bin/chromium --version
