#!/usr/bin/env bash
# The dashboard's real-browser test needs Debian's chromium and chromium-driver.
# Installs them when missing and running as root; otherwise stops with the exact command to run.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium and chromium-driver (browser tests)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  exit 0
fi
echo "The browser tests need chromium and chromium-driver. Run: sudo apt-get install -y chromium chromium-driver" >&2
exit 1
