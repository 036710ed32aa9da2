#!/usr/bin/env bash
# The GPU numbers of the engine benchmark in one bounded run (about 3 minutes on one H200).
#
#   scripts/gpu_bench.sh [OUT]          # OUT: default runs/gpu; run from anywhere
#
# Steps (each under `timeout`, all together under BUDGET seconds; a failing step does not stop
# the next, the summary at the end names the failed ones, exit status 1 if any failed):
#   env       nvidia-smi, python/torch/CUDA/transformers versions, the imports the steps need
#   pair      the tiny target/drafter pair (cascade.tools.tiny_models) into a temp folder
#   tiny      engine bench, tiny target, float32 and bfloat16, rows 1..32, 5 repeats
#   llama8b   engine bench, llama3-8b random weights, bfloat16, rows 1,4,16,32, drafts
#             1,3,7,15,31,63 (passes of 2..64 tokens), tree, prefill 512, 5 repeats
#   inprocess target-only vs speculative tokens/s on the tiny pair, greedy (cascade.bench.step.gpu)
# Each step's output goes to OUT/<step>.log, its results to OUT/<step>/; OUT/steps.tsv holds
# step, exit status, seconds.
#
# Environment: PYTHON (default python3), DEVICE (default cuda), BUDGET (default 195 s),
# SMOKE=1 (tiny sizes, one repeat, a shrunken Llama config instead of llama3-8b: a CPU check:
# `SMOKE=1 DEVICE=cpu PYTHON=.venv/bin/python scripts/gpu_bench.sh /tmp/gpu-smoke`),
# WHEELS=DIR (install the wheels there offline into a temp site folder first). The benchmarks'
# command lines need typer and pydantic: where the image lacks pydantic, carry its wheels
# (pydantic, pydantic-core, annotated-types, typing-inspection); the env step fails fast without.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-runs/gpu}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$ROOT" || exit 2
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
BUDGET=${BUDGET:-195}
SMOKE=${SMOKE:-0}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
START=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cascade-gpu-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
: > "$OUT/steps.tsv"
FAILED=()

# step NAME LIMIT COMMAND...: COMMAND under `timeout LIMIT` (cut to what is left of BUDGET),
# its output shown and kept in OUT/NAME.log.
step() {
    local name=$1 limit=$2 left started rc shown
    shift 2
    left=$((BUDGET - ($(date +%s) - START) - 3))
    if ((left < 5)); then
        echo "=== $name: skipped, the ${BUDGET} s budget is spent" | tee "$OUT/$name.log"
        printf '%s\tskipped\t0\n' "$name" >>"$OUT/steps.tsv"
        FAILED+=("$name (skipped)")
        return
    fi
    ((limit > left)) && limit=$left
    shown="$*"
    echo "=== $name (timeout ${limit} s): ${shown:0:300}" | tee "$OUT/$name.log"
    started=$(date +%s)
    timeout -k 2 "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - started))" >>"$OUT/steps.tsv"
    echo "=== $name: exit $rc after $(($(date +%s) - started)) s" | tee -a "$OUT/$name.log"
    if ((rc != 0)); then
        FAILED+=("$name (exit $rc$( ((rc == 124 || rc == 137)) && echo ', timed out'))")
    fi
}

env_report() {
    command -v nvidia-smi >/dev/null && nvidia-smi || echo "no nvidia-smi"
    "$PYTHON" - "$DEVICE" <<'EOF'
import platform, sys
import torch, transformers
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "cuda available", torch.cuda.is_available())
if sys.argv[1].startswith("cuda"):
    print("gpu", torch.cuda.get_device_name(sys.argv[1]), torch.cuda.get_device_properties(sys.argv[1]))
import cascade.bench.step.engine, cascade.bench.step.gpu  # the steps' imports: fail here, not later
EOF
}

# A Llama config shaped like llama3-8b but tiny (SMOKE), as a folder of its config.json.
small_llama() {
    "$PYTHON" -c "import sys; from transformers import LlamaConfig; LlamaConfig(hidden_size=64, \
num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=224, \
vocab_size=1024, rope_theta=500000.0, max_position_embeddings=1024, \
tie_word_embeddings=False).save_pretrained(sys.argv[1])" "$1"
}

if [[ -n ${WHEELS:-} ]]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$WORK/site" "$WHEELS"/*.whl && export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi

ENGINE=("$PYTHON" -m cascade.bench.step.engine --device "$DEVICE" --no-hf-compile)
PAIR="$WORK/pair"
if [[ $SMOKE == 1 ]]; then
    TINY=(--repeats 1 --rows 1,2 --drafts 2 --no-tree --prefill 32 --context 16 --bandwidth-mib 64)
    BIG_TARGET="$WORK/small-llama"
    BIG=(--repeats 1 --rows 1,4 --drafts 1,3 --prefill 32 --context 16 --bandwidth-mib 64)
    SPEC=(--max-tokens 8 --prompts-per-domain 1 --repeats 1)
    small_llama "$BIG_TARGET"
else
    TINY=(--repeats 5 --rows 1,2,4,8,16,32)
    BIG_TARGET=llama3-8b
    BIG=(--repeats 5 --rows 1,4,16,32 --drafts 1,3,7,15,31,63 --tree --prefill 512)
    SPEC=(--max-tokens 64 --prompts-per-domain 2 --repeats 2)
fi

export PYTHON DEVICE
export -f env_report
step env 25 bash -c env_report
step pair 25 "$PYTHON" -c "import sys; from pathlib import Path; \
from cascade.tools.tiny_models import build_tiny_pair; print(build_tiny_pair(Path(sys.argv[1])))" "$PAIR"
step tiny 45 "${ENGINE[@]}" --target "$PAIR/target" --dtype float32 --dtype bfloat16 \
    "${TINY[@]}" --out "$OUT/tiny"
step llama8b 75 "${ENGINE[@]}" --target "$BIG_TARGET" --random-weights --dtype bfloat16 \
    "${BIG[@]}" --out "$OUT/llama8b"
step inprocess 40 "$PYTHON" -m cascade.bench.step.gpu --device "$DEVICE" --target "$PAIR/target" \
    --drafter "$PAIR/drafter" --k 4 "${SPEC[@]}" --out "$OUT/inprocess/inprocess.json"

echo "=== done in $(($(date +%s) - START)) s; results under $OUT"
column -t "$OUT/steps.tsv" 2>/dev/null || cat "$OUT/steps.tsv"
if ((${#FAILED[@]})); then
    echo "failed: ${FAILED[*]}"
    exit 1
fi
echo "every step passed"
