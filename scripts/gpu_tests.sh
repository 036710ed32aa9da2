#!/usr/bin/env bash
# The core exactness tests on a CUDA device: the tests' tiny models run there
# (CASCADE_TEST_DEVICE), greedy output must still equal plain greedy decoding token for token
# in float32, and the batch-invariant mode must hold where its probe verifies.
#
#   bash scripts/gpu_tests.sh [OUT]        # OUT (default runs/gpu-tests): tests.log
#
# DEVICE (default cuda), PYTHON (default python3) and TESTS_TIMEOUT (seconds for the whole run,
# default 300) override. One pytest run per file, so a run cut at the time limit keeps every
# finished file's failures with their tracebacks (pytest prints them only at its end).
set -u
out=${1:-runs/gpu-tests}
mkdir -p "$out"
export CASCADE_TEST_DEVICE=${DEVICE:-cuda} PYTHONUNBUFFERED=1
# The engine's exactness first; the loop's exactness matrix (the longest) last.
files=(
  tests/core/verify/test_engine.py tests/core/verify/test_invariant.py
  tests/core/kv/test_paged_kv.py tests/core/forward/test_batched_attention.py
  tests/core/verify/test_token_trees.py tests/core/proposers/test_tree_kv.py
  tests/core/forward/test_attention_families.py tests/core/model/test_runner.py
  tests/core/features/test_feature_drafter.py tests/core/kv/test_prefix_share.py
  tests/core/test_loop_exactness.py
)
budget=${TESTS_TIMEOUT:-300}
started=$(date +%s)
status=0
: > "$out/tests.log"
for file in "${files[@]}"; do
  left=$((budget - ($(date +%s) - started)))
  if ((left < 5)); then
    echo "skipped (time limit): $file" | tee -a "$out/tests.log"
    status=124
    continue
  fi
  timeout -k 5 "$left" "${PYTHON:-python3}" -m pytest -v -p no:cacheprovider --timeout 120 \
    --tb=short -o addopts="-m 'not slow'" -rfE "$file" 2>&1 | tee -a "$out/tests.log"
  code=${PIPESTATUS[0]}
  ((code != 0 && status == 0)) && status=$code
done
echo "gpu tests exit status: $status (124: cut at the time limit)" | tee -a "$out/tests.log"
exit "$status"
