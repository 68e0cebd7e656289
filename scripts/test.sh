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
# Two workers (pytest-xdist), one test file per worker at a time: Spark sessions and live
# services are per file. CDC_TEST_WORKERS=0 runs in this process (e.g. for pdb).
workers=${CDC_TEST_WORKERS:-2}
if [ "$workers" = "0" ]; then
  exec .venv/bin/python -m pytest "$@"
fi
# --no-loadscope-reorder: keep the collection order (heavy files first, tests/conftest.py)
# instead of xdist's "most tests first", which left the minutes-long files for last.
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder --durations=25 "$@"
