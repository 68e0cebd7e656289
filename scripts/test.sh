#!/usr/bin/env bash
# Set up (bootstrap + headless Chromium for the browser test) and run the test suite.
# Default tier: every core behaviour. Slow tier: CDC_SLOW=1. Extra pytest args pass through.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
if [ -x scripts/install_browser.sh ]; then
  scripts/install_browser.sh || echo "[test] WARNING: could not install Chromium; the browser test will be skipped"
fi
mkdir -p test-artifacts
exec .venv/bin/python -m pytest "$@"
