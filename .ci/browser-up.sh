#!/usr/bin/env bash
# A real headless browser for the HTML report's test (tests/test_report_html_browser.py): Debian's
# `chromium` and `chromium-driver`, installed with apt when missing; safe to rerun. Prints one
# status line. Without a browser the browser test is skipped with a reason.
set -euo pipefail
log() { echo "browser-up: $*" >&2; }

if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    echo "browser-up: $(chromium --version 2>/dev/null | head -1) and chromedriver are installed"
    exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { log "not root and no sudo: cannot install chromium"; exit 1; }
    SUDO="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
for attempt in 1 2 3; do  # another apt (slurm-up.sh) may hold the lock for a while
    if $SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q \
             --no-install-recommends chromium chromium-driver >/dev/null; }; then
        break
    fi
    log "apt-get failed (attempt $attempt); retrying in 20 s"
    sleep 20
done
command -v chromium >/dev/null && command -v chromedriver >/dev/null \
    || { log "chromium or chromedriver still missing"; exit 1; }
echo "browser-up: $(chromium --version 2>/dev/null | head -1) and chromedriver installed"
