#!/usr/bin/env bash
# Debian packages the tests need. Installs only what is missing (apt-get needs root).
set -euo pipefail
need=()
# (filled in as tests start needing system services)
# prometheus: the real Prometheus and promtool of tests/integration/test_prometheus*.py and the rule tests
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then need+=(prometheus); fi
# chromium: renders report.html headless in tests/integration/test_report_real.py (screenshot, no missing image)
if ! command -v chromium >/dev/null 2>&1; then need+=(chromium); fi
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
