#!/usr/bin/env bash
# Install the headless browser for tests/test_browser.py: Debian's `chromium` at /usr/bin/chromium.
# The Python `playwright` package (in the venv) drives it via executable_path; this project never
# runs `playwright install` (no browser downloads from the Playwright CDN).
#
#   sudo scripts/install_browser.sh        # or as root
# Then: CDC_SLOW=1 pytest -m browser tests/test_browser.py   (CDC_REQUIRE_BROWSER=1 makes a
# missing browser fail the test instead of skipping it)
set -euo pipefail

if [[ -x /usr/bin/chromium ]]; then
  echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install_browser: no apt-get; install Chromium with your OS package manager so that" \
       "/usr/bin/chromium exists (or set CDC_CHROMIUM=/path/to/chromium for the tests)" >&2
  exit 1
fi
SUDO=""
[[ "$(id -u)" == 0 ]] || SUDO="sudo"
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y chromium
/usr/bin/chromium --version
