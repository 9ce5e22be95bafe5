#!/usr/bin/env bash
# Install what the browser tests (tests/browser, marked `browser` and `slow`) need
# on Debian: Debian's own Chromium and fonts for the screenshots. Run as root.
# The tests drive Chromium over the DevTools protocol with the `websockets`
# package rtserver already depends on: no Playwright, no browser download.
#   scripts/install_browser.sh
set -euo pipefail
pkgs=(chromium fonts-liberation fonts-dejavu-core)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_browser: ${pkgs[*]} already installed"
  exit 0
fi
echo "install_browser: apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
chromium --version 2>/dev/null || true
