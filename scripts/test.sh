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
# (Measured: xdist's own file order - most tests first - finished 50 s sooner than running the
# minutes-long files first, which put two JVM-heavy files against each other.)
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --durations=25 "$@"
