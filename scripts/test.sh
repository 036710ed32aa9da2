#!/usr/bin/env bash
# Install everything, then run the whole test suite (slow benchmarks excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# kubectl renders the Kubernetes manifests in the tests (they skip, saying so, without it).
command -v kubectl >/dev/null || { apt-get install -y -q kubectl >/dev/null 2>&1 || \
  echo "kubectl could not be installed: the manifest tests will be skipped"; }
# Chromium runs the playground's browser tests (they skip, saying so, without it).
command -v chromium >/dev/null || { apt-get install -y -q chromium >/dev/null 2>&1 || \
  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } || \
  echo "chromium could not be installed: the playground browser tests will be skipped"; }
# Two workers (pytest-xdist; each file on one worker, the longest files first: tests/conftest.py),
# then the tests that react to measured times alone on a quiet machine. Exit status 5 is "no test
# selected".
allow_none() { "$@" || { status=$?; [ "$status" -eq 5 ] || return "$status"; }; }
allow_none .venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder \
  -m "not slow and not timing" "$@"
allow_none .venv/bin/python -m pytest -q -m "timing and not slow" "$@"
