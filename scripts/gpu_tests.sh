#!/usr/bin/env bash
# The core exactness tests on a CUDA device: the tests' tiny models run there
# (CASCADE_TEST_DEVICE), greedy output must still equal plain greedy decoding token for token
# in float32, and the batch-invariant mode must hold where its probe verifies.
#
#   bash scripts/gpu_tests.sh [OUT]        # OUT (default runs/gpu-tests): log and junit XML
#
# DEVICE (default cuda), PYTHON (default python3) and TESTS_TIMEOUT (seconds, default 150)
# override; the run is cut at TESTS_TIMEOUT whatever happens.
set -u
out=${1:-runs/gpu-tests}
mkdir -p "$out"
export CASCADE_TEST_DEVICE=${DEVICE:-cuda} PYTHONUNBUFFERED=1
# The engine's exactness first; the loop's exactness matrix (the longest) last: a run cut at the
# time limit still reports every test it finished (-v prints each as it ends).
files=(
  tests/core/test_engine.py tests/core/test_invariant.py tests/core/test_paged_kv.py
  tests/core/test_batched_attention.py tests/core/test_token_trees.py tests/core/test_tree_kv.py
  tests/core/test_attention_families.py tests/core/test_runner.py
  tests/core/test_feature_drafter.py tests/core/test_prefix_share.py
  tests/core/test_loop_exactness.py
)
timeout -k 5 "${TESTS_TIMEOUT:-150}" "${PYTHON:-python3}" -m pytest -v -p no:cacheprovider \
  --timeout 120 -o addopts="-m 'not slow'" --junitxml "$out/junit.xml" -rfE "${files[@]}" \
  2>&1 | tee "$out/tests.log"
status=${PIPESTATUS[0]}
echo "gpu tests exit status: $status (124: cut at the time limit)"
exit "$status"
