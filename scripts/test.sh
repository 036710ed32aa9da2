#!/usr/bin/env bash
# Install everything, then run the whole test suite (slow benchmarks excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# kubectl renders the Kubernetes manifests in the tests (they skip, saying so, without it).
command -v kubectl >/dev/null || { apt-get install -y -q kubectl >/dev/null 2>&1 || \
  echo "kubectl could not be installed: the manifest tests will be skipped"; }
.venv/bin/python -m pytest -q "$@"
