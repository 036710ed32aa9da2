#!/usr/bin/env bash
# Install everything, then run the whole test suite (slow benchmarks excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/python -m pytest -q "$@"
